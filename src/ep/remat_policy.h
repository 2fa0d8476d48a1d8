// Which expert activations the backward finds saved and which it recomputes
// (DESIGN.md §4.7). Names:
//   x_sorted  the expert-sorted input rows with their routing metadata
//             (remat re-runs the dispatch: the all-to-all exchange, or the
//             ring's token all-gather, and the sort);
//   mlpwi_0   x_sorted wi0 [rows, F]   (remat: one grouped GEMM)
//   mlpwi_1   x_sorted wi1 [rows, F]   (remat: one grouped GEMM)
//   mlpwo     the experts' outputs [rows, H] (remat: SwiGLU + one grouped GEMM)
// Presets (key remat_policy): full = recompute everything, minimal = save
// everything (the least recompute), save_dispatch = save x_sorted and
// recompute the rest, custom = the per-name keys remat.<name>=save|remat.
// Gradients are bit-identical whatever the choice.
#pragma once

#include <string>
#include <string_view>

namespace epmoe::ep {

struct RematPolicy {
  bool save_x_sorted = true;
  bool save_mlpwi_0 = true;
  bool save_mlpwi_1 = true;
  bool save_mlpwo = true;

  // Throws ConfigError naming the key for an unknown preset.
  static RematPolicy preset(std::string_view key, std::string_view name);
  // "save" / "remat" for one name; throws ConfigError naming the key.
  static bool parse_choice(std::string_view key, std::string_view value);
  std::string describe() const;  // "x_sorted=save mlpwi_0=remat ..."
};

}  // namespace epmoe::ep
