// SPDX-License-Identifier: Apache-2.0
#include "launch/root_cause.h"

#include <string.h>

#include <algorithm>

#include <fmt/format.h>

namespace pushpull::launch {
namespace {

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("signal {} (SIG{})", sig, abbrev) : fmt::format("signal {}", sig);
}

bool failed_by_itself(const ChildState& c) {
  return c.ended && !c.stopped && !(c.exited && c.code == 0);
}

int exit_code_of(const ChildState& c) {
  return c.exited ? c.code : 128 + c.code;
}

constexpr const char* kByScheduler = "reported by the scheduler";
constexpr std::string_view kSchedulerEnded = "the scheduler ended the job: ";

// What a report says about its node: the text after "<node> (host ...) failed: "
// (or after "the scheduler ended the job: ").
std::string report_tail(const std::string& message) {
  if (auto at = message.find(kSchedulerEnded); at != std::string::npos)
    return message.substr(at + kSchedulerEnded.size());
  auto at = message.find(") failed: ");
  return at == std::string::npos ? message : message.substr(at + 10);
}

struct Candidate {
  int rank = 0;
  size_t order = 0;
  std::optional<size_t> child;  // the node it blames
  std::string source;           // who reported it, when the node did not fail by itself
  std::string message;          // what they said
};

}  // namespace

std::string describe_end(bool exited, int code) {
  return exited ? fmt::format("exited with code {}", code) : "was killed by " + signal_text(code);
}

std::string describe_child(const ChildState& c) {
  std::string where;
  if (c.pid > 0) where = fmt::format("pid {}", c.pid);
  if (!c.host.empty()) where += (where.empty() ? "host " : ", host ") + c.host;
  return where.empty() ? c.label : fmt::format("{} ({})", c.label, where);
}

std::optional<std::string> node_named_in(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    size_t w = text.find("worker ", pos), s = text.find("server ", pos),
           r = text.find("rank ", pos);
    size_t at = std::min({w, s, r});
    if (at == std::string_view::npos) return std::nullopt;
    const bool is_rank = at == r;
    size_t i = at + (is_rank ? 5 : 7), digits = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9')
      ++i;
    auto rest = text.substr(i);
    if (i > digits && (rest.starts_with(" (host ") || rest.starts_with(" (not registered"))) {
      // The collectives name their members by rank, and a job's collective
      // rank is its worker rank (the ranks are the workers).
      if (is_rank) return "worker " + std::string(text.substr(digits, i - digits));
      return std::string(text.substr(at, i - at));
    }
    pos = at + 1;
  }
  return std::nullopt;
}

std::string_view failure_report_in(std::string_view line) {
  auto at = line.find("PeerFailure");
  // C++ programs often print only what() of the error: the collectives'
  // verdict still names the member ("collective: rank 2 (host ...) failed").
  if (at == std::string_view::npos) at = line.find("collective: rank ");
  return at == std::string_view::npos ? std::string_view{} : line.substr(at);
}

std::string blamed_in(std::string_view line) {
  line = failure_report_in(line);
  if (line.empty()) return "";
  if (auto who = node_named_in(line)) return *who;
  return line.find(kSchedulerEnded) != std::string_view::npos ? "scheduler" : "";
}

RootCause find_root_cause(const std::vector<ChildState>& children,
                          const std::vector<FailureEvent>& events) {
  auto index_of = [&](const std::optional<std::string>& label) -> std::optional<size_t> {
    if (!label) return std::nullopt;
    for (size_t i = 0; i < children.size(); ++i)
      if (children[i].label == *label) return i;
    return std::nullopt;
  };
  std::vector<Candidate> candidates;
  bool scheduler_reported = false;
  for (size_t order = 0; order < events.size(); ++order) {
    const auto& e = events[order];
    if (e.kind == FailureEvent::Kind::kScheduler) {
      if (auto named = index_of(node_named_in(e.message)))
        candidates.push_back({2, order, named, kByScheduler, e.message});
      else
        candidates.push_back({5, order, std::nullopt, "the scheduler", e.message});
      scheduler_reported = true;
      continue;
    }
    const auto& c = children.at(e.child);
    if (c.blames == "scheduler") {
      candidates.push_back({5, order, std::nullopt, "the scheduler", report_tail(c.blame_line)});
      continue;
    }
    if (auto blamed = index_of(c.blames); blamed && *blamed != e.child) {
      candidates.push_back({2, order, blamed, "reported by " + c.label, c.blame_line});
      continue;
    }
    int rank = !c.exited ? (scheduler_reported ? 3 : 1) : c.code != 1 ? 3 : 4;
    candidates.push_back({rank, order, e.child, "", ""});
  }
  RootCause out;
  if (candidates.empty()) return out;
  const Candidate* root = &candidates[0];
  for (const auto& c : candidates)
    if (c.rank < root->rank || (c.rank == root->rank && c.order < root->order)) root = &c;

  // Several reports about the same node: the scheduler's is the verdict.
  for (const auto& c : candidates)
    if (c.rank == 2 && c.child == root->child && c.source == kByScheduler) root = &c;
  std::optional<size_t> root_child = root->child;
  if (!root_child) {
    out.reason = fmt::format("{} reported: {}", root->source, root->message);
  } else if (const auto& c = children[*root_child]; failed_by_itself(c)) {
    out.exit_code = exit_code_of(c);
    out.reason = describe_child(c) + " " + describe_end(c.exited, c.code);
    // Why the job could not go on without it, when the scheduler said so
    // about that very node (a server with replicas: "no replica left").
    for (const auto& e : events)
      if (e.kind == FailureEvent::Kind::kScheduler &&
          index_of(node_named_in(e.message)) == root_child) {
        if (auto at = e.message.find("no replica left"); at != std::string::npos)
          out.reason += "; " + e.message.substr(at);
        break;
      }
  } else {
    // A node that did not fail by itself: stopped (SIGSTOP, hung), or it
    // exited 0 while the others still needed it.
    std::string state = c.ended && !c.stopped ? ", " + describe_end(c.exited, c.code) : "";
    out.reason = fmt::format("{} failed ({}{}): {}", describe_child(c), root->source, state,
                             report_tail(root->message));
  }
  for (const auto& e : events) {
    if (e.kind != FailureEvent::Kind::kChild || e.child == root_child) continue;
    const auto& c = children[e.child];
    out.consequences.push_back(c.label + " " + describe_end(c.exited, c.code));
  }
  return out;
}

}  // namespace pushpull::launch
