#include "reference_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "bounded_value.h"
#include "core/error.h"

namespace epmoe::testing {
namespace {

Tensor random_tensor(Shape shape, Rng& rng, double scale) {
  Tensor t(DType::f32, std::move(shape));
  for (float& v : t.span<float>()) v = static_cast<float>(rng.normal() * scale);
  return t;
}

std::vector<double> to_double(const Tensor& t) {
  const auto s = t.span<float>();
  return {s.begin(), s.end()};
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
using std::exp;

template <typename T>
std::vector<int> top_indices(const std::vector<T>& score, std::vector<int> candidates, int count) {
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int a, int b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
  candidates.resize(static_cast<std::size_t>(count));
  return candidates;
}

// The central value of a reference scalar (selection ignores error bounds).
double central(double a) { return a; }
double central(BoundedValue a) { return a.value; }

// Experts chosen for one token from its logits (double).
template <typename T>
std::vector<int> choose_experts(const RouterConfig& cfg, const std::vector<T>& logits,
                                const std::vector<double>& bias) {
  const int num_experts = cfg.num_experts;
  std::vector<int> all(static_cast<std::size_t>(num_experts));
  std::iota(all.begin(), all.end(), 0);
  if (cfg.kind != RouterKind::sigmoid_grouped) {
    if (cfg.n_groups == 1) return top_indices<T>(logits, all, cfg.top_k);
    // DeepSeek-V2 group-limited greedy: scores = softmax(logits) over all E,
    // a group scores its max probability, the top topk_groups groups are
    // kept, top-K among their experts. Written on the probabilities, as
    // DeepSeek-V2 does (the layer ranks logits; softmax is monotone).
    std::vector<double> probability(static_cast<std::size_t>(num_experts));
    double max_logit = central(logits[0]), denominator = 0;
    for (int e = 0; e < num_experts; ++e) max_logit = std::max(max_logit, central(logits[e]));
    for (int e = 0; e < num_experts; ++e) denominator += std::exp(central(logits[e]) - max_logit);
    for (int e = 0; e < num_experts; ++e) probability[e] = std::exp(central(logits[e]) - max_logit) / denominator;
    const int group_size = num_experts / cfg.n_groups;
    std::vector<double> group_score(static_cast<std::size_t>(cfg.n_groups), 0.0);
    for (int g = 0; g < cfg.n_groups; ++g)
      for (int e = g * group_size; e < (g + 1) * group_size; ++e)
        group_score[g] = std::max(group_score[g], probability[e]);
    std::vector<int> groups(static_cast<std::size_t>(cfg.n_groups));
    std::iota(groups.begin(), groups.end(), 0);
    std::vector<int> candidates;
    for (int g : top_indices(group_score, groups, cfg.topk_groups))
      for (int e = g * group_size; e < (g + 1) * group_size; ++e) candidates.push_back(e);
    return top_indices(probability, candidates, cfg.top_k);
  }
  std::vector<double> selection(static_cast<std::size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) selection[e] = magnitude(sigmoid(logits[e])) + bias[e];
  const int group_size = num_experts / cfg.n_groups;
  std::vector<double> group_score(static_cast<std::size_t>(cfg.n_groups));
  for (int g = 0; g < cfg.n_groups; ++g) {
    std::vector<int> members(static_cast<std::size_t>(group_size));
    std::iota(members.begin(), members.end(), g * group_size);
    for (int e : top_indices(selection, members, std::min(2, group_size))) group_score[g] += selection[e];
  }
  std::vector<int> groups(static_cast<std::size_t>(cfg.n_groups));
  std::iota(groups.begin(), groups.end(), 0);
  std::vector<int> candidates;
  for (int g : top_indices(group_score, groups, cfg.topk_groups))
    for (int e = g * group_size; e < (g + 1) * group_size; ++e) candidates.push_back(e);
  return top_indices(selection, candidates, cfg.top_k);
}

// Routing weights of one token from its logits and chosen ids; and the
// Jacobian-vector product back to the logits.
template <typename T>
std::vector<T> routing_weights(const RouterConfig& cfg, const std::vector<T>& logits, const std::vector<int>& ids) {
  const int top_k = cfg.top_k;
  std::vector<T> w(static_cast<std::size_t>(top_k));
  if (cfg.kind == RouterKind::sigmoid_grouped) {
    T sum = 0;
    for (int k = 0; k < top_k; ++k) sum += sigmoid(logits[ids[k]]);
    for (int k = 0; k < top_k; ++k)
      w[k] =
          (cfg.norm_topk_prob ? sigmoid(logits[ids[k]]) / sum : sigmoid(logits[ids[k]])) * T(cfg.routed_scaling_factor);
    return w;
  }
  T denominator = 0;
  if (cfg.norm_topk_prob) {
    for (int k = 0; k < top_k; ++k) denominator += exp(logits[ids[k]]);
  } else {
    for (const T& l : logits) denominator += exp(l);
  }
  for (int k = 0; k < top_k; ++k) w[k] = exp(logits[ids[k]]) / denominator * T(cfg.routed_scaling_factor);
  return w;
}

template <typename T>
std::vector<T> routing_weights_backward(const RouterConfig& cfg, const std::vector<T>& logits,
                                        const std::vector<int>& ids, const std::vector<T>& w,
                                        const std::vector<T>& dw) {
  const int top_k = cfg.top_k;
  std::vector<T> dl(logits.size(), T(0.0));
  T weighted = 0;
  for (int k = 0; k < top_k; ++k) weighted += w[k] * dw[k];
  if (cfg.kind == RouterKind::sigmoid_grouped) {
    const T c = cfg.routed_scaling_factor;
    T sum = 0;
    for (int k = 0; k < top_k; ++k) sum += sigmoid(logits[ids[k]]);
    for (int k = 0; k < top_k; ++k) {
      const T s = sigmoid(logits[ids[k]]);
      const T ds = cfg.norm_topk_prob ? c / sum * (dw[k] - weighted / c) : c * dw[k];
      dl[ids[k]] = ds * s * (T(1) - s);
    }
  } else if (cfg.norm_topk_prob) {
    // w = c p, p = softmax over the K: dl_k = p_k (c dw_k - sum_j p_j c dw_j),
    // and sum_j p_j c dw_j = sum_j w_j dw_j = weighted.
    const T c = cfg.routed_scaling_factor;
    for (int k = 0; k < top_k; ++k) dl[ids[k]] = w[k] / c * (c * dw[k] - weighted);
  } else {
    // w_k = c P_k, P = softmax over all E: dl_e = P_e (dP_e - sum_j P_j dP_j),
    // dP = c dw on the chosen experts.
    T denominator = 0;
    for (const T& l : logits) denominator += exp(l);
    for (std::size_t e = 0; e < logits.size(); ++e) dl[e] = -(exp(logits[e]) / denominator * weighted);
    for (int k = 0; k < top_k; ++k) dl[ids[k]] += w[k] * dw[k];
  }
  return dl;
}

}  // namespace

MoeProblem make_problem(std::int64_t num_tokens, std::int64_t hidden, std::int64_t ffn, RouterConfig router,
                        std::uint64_t seed, double bias_scale) {
  Rng rng(seed);
  const std::int64_t e = router.num_experts;
  MoeProblem p;
  p.num_tokens = num_tokens;
  p.hidden = hidden;
  p.ffn = ffn;
  p.router = router;
  p.x = random_tensor({num_tokens, hidden}, rng, 1.0);
  p.gate = random_tensor({hidden, e}, rng, 1.0 / std::sqrt(double(hidden)));
  p.wi0 = random_tensor({e, hidden, ffn}, rng, 1.0 / std::sqrt(double(hidden)));
  p.wi1 = random_tensor({e, hidden, ffn}, rng, 1.0 / std::sqrt(double(hidden)));
  p.wo = random_tensor({e, ffn, hidden}, rng, 1.0 / std::sqrt(double(ffn)));
  p.bias = random_tensor({e}, rng, bias_scale);
  p.dy = random_tensor({num_tokens, hidden}, rng, 1.0);
  return p;
}

namespace {

// The reference loop over tokens and their K experts, on scalar type T
// (double, or BoundedValue to carry error bounds). `u` is the unit roundoff
// of the expert GEMMs' operands (0 for fp32 compute); the router is fp32, so
// its products are not rounded.
template <typename T>
BasicReferenceResult<T> reference_loop(const MoeProblem& p, const std::vector<std::int32_t>& given_ids,
                                       const Tensor* given_logits, double u, const std::vector<bool>& dropped = {},
                                       const std::vector<T>& expert_x = {},
                                       ContributionMagnitudes* magnitudes = nullptr) {
  const std::int64_t N = p.num_tokens, H = p.hidden, F = p.ffn;
  const int E = p.router.num_experts, K = p.router.top_k;
  auto to_scalars = [](const Tensor& t) {
    const auto s = t.span<float>();
    return std::vector<T>(s.begin(), s.end());
  };
  const auto x = to_scalars(p.x), gate = to_scalars(p.gate), wi0 = to_scalars(p.wi0), wi1 = to_scalars(p.wi1),
             wo = to_scalars(p.wo), dy = to_scalars(p.dy);
  const std::vector<double> bias = to_double(p.bias);
  const bool uses_gate = p.router.kind != RouterKind::random;
  EPMOE_CHECK(uses_gate || given_logits != nullptr);
  auto q = [u](const T& v) { return round_operand(v, u); };

  BasicReferenceResult<T> r;
  r.topk_ids.resize(static_cast<std::size_t>(N * K));
  r.topk_weights.resize(static_cast<std::size_t>(N * K));
  r.y.assign(static_cast<std::size_t>(N * H), T(0.0));
  r.dx.assign(static_cast<std::size_t>(N * H), T(0.0));
  r.dgate.assign(static_cast<std::size_t>(H * E), T(0.0));
  r.dwi0.assign(static_cast<std::size_t>(E * H * F), T(0.0));
  r.dwi1.assign(static_cast<std::size_t>(E * H * F), T(0.0));
  r.dwo.assign(static_cast<std::size_t>(E * F * H), T(0.0));

  if (magnitudes != nullptr) {
    magnitudes->y.assign(static_cast<std::size_t>(N * H), 0.0);
    magnitudes->dx.assign(static_cast<std::size_t>(N * H), 0.0);
  }
  std::vector<T> logits(static_cast<std::size_t>(E));
  std::vector<T> h0(F), h1(F), act(F), out(H), dact(F), dh0(F), dh1(F), d_out(H);
  for (std::int64_t t = 0; t < N; ++t) {
    const T* xt = &x[t * H];
    // What the experts see: x, or x after a lossy trip (fp8 tokens).
    const T* xe = expert_x.empty() ? xt : &expert_x[t * H];
    for (int e = 0; e < E; ++e) {
      T l = 0;
      if (uses_gate) {
        for (std::int64_t j = 0; j < H; ++j) l += xt[j] * gate[j * E + e];
      } else {
        l = given_logits->data<float>()[t * E + e];
      }
      logits[e] = l;
    }
    std::vector<int> ids = choose_experts<T>(p.router, logits, bias);
    if (!given_ids.empty()) ids.assign(given_ids.begin() + t * K, given_ids.begin() + (t + 1) * K);
    const std::vector<T> w = routing_weights<T>(p.router, logits, ids);
    std::vector<T> dw(static_cast<std::size_t>(K), T(0.0));
    const T* dyt = &dy[t * H];
    for (int k = 0; k < K; ++k) {
      const int e = ids[k];
      r.topk_ids[t * K + k] = e;
      r.topk_weights[t * K + k] = w[k];
      if (!dropped.empty() && dropped[t * K + k]) continue;
      const T* w0 = &wi0[e * H * F];
      const T* w1 = &wi1[e * H * F];
      const T* w2 = &wo[e * F * H];
      for (std::int64_t f = 0; f < F; ++f) {
        h0[f] = h1[f] = 0;
        for (std::int64_t j = 0; j < H; ++j) {
          h0[f] += q(xe[j]) * q(w0[j * F + f]);
          h1[f] += q(xe[j]) * q(w1[j * F + f]);
        }
        act[f] = h0[f] * sigmoid(h0[f]) * h1[f];
      }
      for (std::int64_t j = 0; j < H; ++j) {
        out[j] = 0;
        for (std::int64_t f = 0; f < F; ++f) out[j] += q(act[f]) * q(w2[f * H + j]);
        r.y[t * H + j] += w[k] * out[j];
        if (magnitudes != nullptr) magnitudes->y[t * H + j] += magnitude(w[k] * out[j]);
      }
      // Backward of this (token, expert) pair.
      for (std::int64_t j = 0; j < H; ++j) {
        dw[k] += dyt[j] * out[j];
        d_out[j] = w[k] * dyt[j];
      }
      for (std::int64_t f = 0; f < F; ++f) {
        dact[f] = 0;
        for (std::int64_t j = 0; j < H; ++j) {
          dact[f] += q(d_out[j]) * q(w2[f * H + j]);
          r.dwo[e * F * H + f * H + j] += q(act[f]) * q(d_out[j]);
        }
        const T s = sigmoid(h0[f]);
        dh0[f] = dact[f] * h1[f] * (s + h0[f] * s * (T(1) - s));
        dh1[f] = dact[f] * h0[f] * s;
      }
      for (std::int64_t j = 0; j < H; ++j) {
        T dx_pair = 0;  // this pair's part of dx[t, j]
        for (std::int64_t f = 0; f < F; ++f) {
          r.dwi0[e * H * F + j * F + f] += q(xe[j]) * q(dh0[f]);
          r.dwi1[e * H * F + j * F + f] += q(xe[j]) * q(dh1[f]);
          dx_pair += q(dh0[f]) * q(w0[j * F + f]) + q(dh1[f]) * q(w1[j * F + f]);
        }
        r.dx[t * H + j] += dx_pair;
        if (magnitudes != nullptr) magnitudes->dx[t * H + j] += magnitude(dx_pair);
      }
    }
    if (uses_gate) {
      const std::vector<T> dl = routing_weights_backward<T>(p.router, logits, ids, w, dw);
      for (std::int64_t j = 0; j < H; ++j)
        for (int e = 0; e < E; ++e) {
          r.dgate[j * E + e] += xt[j] * dl[e];
          r.dx[t * H + j] += dl[e] * gate[j * E + e];
        }
    }
  }
  return r;
}

}  // namespace

double round_to_bf16(double a) {
  const float f = static_cast<float>(a);
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return a;
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even at bit 16
  bits &= 0xffff0000u;
  float rounded;
  std::memcpy(&rounded, &bits, sizeof rounded);
  return rounded;
}

ReferenceResult reference_moe(const MoeProblem& problem, const std::vector<std::int32_t>& ids, const Tensor* logits) {
  return reference_loop<double>(problem, ids, logits, 0.0);
}

ReferenceResult reference_moe_with_drops(const MoeProblem& problem, const std::vector<std::int32_t>& ids,
                                         const std::vector<bool>& dropped) {
  return reference_loop<double>(problem, ids, nullptr, 0.0, dropped);
}

ReferenceResult reference_moe_with_expert_input(const MoeProblem& problem, const std::vector<std::int32_t>& ids,
                                                const Tensor& expert_x) {
  const auto values = expert_x.span<float>();
  return reference_loop<double>(problem, ids, nullptr, 0.0, {}, std::vector<double>(values.begin(), values.end()));
}

BoundedReferenceResult reference_moe_with_lossy_tokens(const MoeProblem& problem, const std::vector<std::int32_t>& ids,
                                                       const std::vector<double>& token_error_bound) {
  const auto x = problem.x.span<float>();
  std::vector<BoundedValue> expert_x(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) expert_x[i] = BoundedValue(x[i], token_error_bound[i]);
  return reference_loop<BoundedValue>(problem, ids, nullptr, 0.0, {}, expert_x);
}

ReferenceResult reference_moe_bf16_emulated(const MoeProblem& problem, const std::vector<std::int32_t>& ids) {
  return reference_loop<double>(problem, ids, nullptr, 1.0 / 256);
}

BoundedReferenceResult reference_moe_bounded(const MoeProblem& problem, double operand_roundoff,
                                             const std::vector<std::int32_t>& ids, const Tensor* logits) {
  return reference_loop<BoundedValue>(problem, ids, logits, operand_roundoff);
}

ContributionMagnitudes reference_contribution_magnitudes(const MoeProblem& problem,
                                                         const std::vector<std::int32_t>& ids) {
  ContributionMagnitudes magnitudes;
  reference_loop<double>(problem, ids, nullptr, 0.0, {}, {}, &magnitudes);
  return magnitudes;
}

double relative_error(const Tensor& got, const std::vector<double>& ref) {
  EPMOE_CHECK_EQ(static_cast<std::size_t>(got.numel()), ref.size());
  const float* g = got.data<float>();
  double max_diff = 0, max_ref = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(double(g[i]) - ref[i]));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  if (max_ref == 0) return max_diff;
  return max_diff / max_ref;
}

double reference_loss(const MoeProblem& problem) {
  const ReferenceResult r = reference_moe(problem);
  const float* dy = problem.dy.data<float>();
  double loss = 0;
  for (std::size_t i = 0; i < r.y.size(); ++i) loss += double(dy[i]) * r.y[i];
  return loss;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.size_bytes() == b.size_bytes() &&
         (a.size_bytes() == 0 || std::memcmp(a.raw(), b.raw(), static_cast<std::size_t>(a.size_bytes())) == 0);
}

std::vector<double> as_double(const Tensor& t) {
  const auto values = t.span<float>();
  return {values.begin(), values.end()};
}

}  // namespace epmoe::testing
