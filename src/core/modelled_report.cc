#include "core/modelled_report.h"

#include <algorithm>
#include <map>

namespace epmoe {
namespace {

// "all_to_all_v tag 12" -> "all_to_all_v": collectives of one kind together.
std::string collective_kind(const std::string& name) {
  const std::size_t tag = name.find(" tag ");
  return tag == std::string::npos ? name : name.substr(0, tag);
}

}  // namespace

ModelledMark modelled_mark(const ModelledClock& clock) {
  return {clock.now(), clock.totals(), clock.num_collectives()};
}

ModelledRankTime modelled_between(const ModelledClock& clock, const ModelledMark& begin, const ModelledMark& middle,
                                  const ModelledMark& end) {
  ModelledRankTime t;
  t.forward_seconds = to_seconds(middle.time - begin.time);
  t.backward_seconds = to_seconds(end.time - middle.time);
  t.compute_seconds = to_seconds(end.totals.compute - begin.totals.compute);
  t.communication_seconds = to_seconds(end.totals.communication - begin.totals.communication);
  t.idle_seconds = to_seconds(end.totals.idle - begin.totals.idle);
  std::vector<ModelledCollective> collectives = clock.collectives(begin.collectives);
  collectives.resize(std::min(collectives.size(), end.collectives - begin.collectives));
  for (const ModelledCollective& c : collectives) {
    // Times from the interval's start, as forward_seconds is: anything the
    // rank did before (an EP group's construction) does not shift them.
    t.collectives.push_back({c.name, to_seconds(c.start - begin.time), to_seconds(c.end - begin.time),
                             to_seconds(c.exposed()), c.bytes_sent});
  }
  return t;
}

ModelledStep modelled_step(const std::vector<ModelledRankTime>& ranks) {
  ModelledStep step;
  nlohmann::json per_rank = nlohmann::json::array();
  struct KindTotals {
    std::int64_t count = 0, bytes_sent = 0;
    double seconds = 0, exposed_seconds = 0;
  };
  std::map<std::string, KindTotals> kinds;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const ModelledRankTime& t = ranks[r];
    step.step_seconds = std::max(step.step_seconds, t.step_seconds());
    if (t.idle_seconds < ranks[static_cast<std::size_t>(step.critical_rank)].idle_seconds) {
      step.critical_rank = static_cast<int>(r);
    }
    per_rank.push_back({{"rank", r},
                        {"forward_seconds", t.forward_seconds},
                        {"backward_seconds", t.backward_seconds},
                        {"compute_seconds", t.compute_seconds},
                        {"communication_seconds", t.communication_seconds},
                        {"idle_seconds", t.idle_seconds}});
    for (const CollectiveTiming& c : t.collectives) {
      KindTotals& k = kinds[collective_kind(c.name)];
      ++k.count;
      k.bytes_sent += c.bytes_sent;
      k.seconds += c.end_seconds - c.start_seconds;
      k.exposed_seconds += c.exposed_seconds;
    }
  }
  nlohmann::json collectives = nlohmann::json::object();
  for (const auto& [kind, k] : kinds) {
    collectives[kind] = {
        {"count", k.count},
        {"seconds", k.seconds},
        {"exposed_seconds", k.exposed_seconds},
        // Clamped: the two sums of rounded seconds may differ in the last bits.
        {"hidden_fraction", k.seconds > 0 ? std::clamp(1.0 - k.exposed_seconds / k.seconds, 0.0, 1.0) : 1.0},
        {"bytes_sent", k.bytes_sent}};
  }
  step.json = {{"step_seconds", step.step_seconds},
               {"critical_path_rank", step.critical_rank},
               {"per_rank", per_rank},
               {"collectives", collectives}};
  return step;
}

}  // namespace epmoe
