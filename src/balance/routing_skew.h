// Routing skew for tests and benches of the engine: a selection bias for the
// sigmoid_grouped router (the bias only selects experts, never weighs them)
// that makes real routing Zipf-skewed, with the same popularity model as
// balance/load_generator.h: popularity rank i (0 = hottest) has weight
// 1 / (i + 1)^s, hot experts spread round-robin over ranks or packed on rank 0.
//
//   bias_e = scale * log(weight of e's popularity rank)
//
// so the hottest expert gets 0 and colder ones increasingly negative biases;
// with sigmoid scores in (0, 1), scale ~ 1 gives a strong but not total skew.
#pragma once

#include <vector>

#include "balance/load_generator.h"

namespace epmoe::balance {

struct RoutingSkewOptions {
  int num_experts = 0;
  int num_ranks = 1;
  double zipf_exponent = 1.2;
  HotExpertPlacement placement = HotExpertPlacement::packed;
  double scale = 1.0;
};

// [E] selection bias for RouterKind::sigmoid_grouped.
std::vector<float> zipf_selection_bias(const RoutingSkewOptions& options);

}  // namespace epmoe::balance
