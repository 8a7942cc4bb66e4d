// SPDX-License-Identifier: Apache-2.0
// The DistStore's control operations: commands to every server (mode,
// optimizer, states) and gradient compression settings. The data path (init,
// push, pull) is in dist_store.cpp.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "base/executor.h"
#include "compress/two_bit.h"
#include "kvstore/dist_store.h"
#include "ps/protocol.h"

namespace pushpull {

namespace {
constexpr char kStatesMagic[4] = {'P', 'P', 'D', 'S'};
constexpr uint32_t kStatesVersion = 1;
}  // namespace

void DistStore::command_all(uint64_t command, const std::vector<std::string>& payloads,
                            std::vector<std::string>* answers) {
  int servers = node_->num_servers();
  auto done = std::make_shared<Completion>(servers);
  if (answers) answers->assign(static_cast<size_t>(servers), {});
  for (int s = 0; s < servers; ++s) {
    auto text = std::make_shared<std::string>(payloads.size() == 1 ? payloads[0] : payloads.at(s));
    net::Header h{.type = ps::msg::kCommand, .key = command};
    OnData on_data;
    if (answers)
      on_data = [answers, s](const std::byte* d, size_t n) {
        (*answers)[static_cast<size_t>(s)].assign(reinterpret_cast<const char*>(d), n);
      };
    request(s, h, text->data(), text->size(), text, done, 0, std::move(on_data));
  }
  done->wait_for(wait_timeout()).raise();
}

// ---- optimizer, compression ------------------------------------------------

void DistStore::set_updater(Updater) {
  throw InvalidArgument(fmt::format(
      "set_updater on a '{}' store: updates run on the servers, and a C++ function cannot be sent "
      "there; use set_optimizer(spec), or pull the summed gradients and update locally",
      type_));
}

void DistStore::set_optimizer(const OptimizerSpec& spec) {
  create_optimizer(spec);  // the same InvalidArgument on every worker, before any traffic
  Status sent;
  if (rank() == 0) {
    try {
      command_all(static_cast<uint64_t>(ps::Command::kSetOptimizer), {spec.to_string()});
    } catch (...) {
      sent = Status::from_current_exception();
    }
  }
  node_->barrier(cluster::Group::kWorkers);
  sent.raise();
}

void DistStore::save_optimizer_states(const std::string& path) {
  wait_all();
  std::vector<std::string> states;
  command_all(static_cast<uint64_t>(ps::Command::kSaveStates), {""}, &states);
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw IoError(fmt::format("save_optimizer_states: cannot write '{}'", tmp));
    auto put32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
    f.write(kStatesMagic, 4);
    put32(kStatesVersion);
    put32(static_cast<uint32_t>(states.size()));
    for (const auto& s : states) {
      uint64_t n = s.size();
      f.write(reinterpret_cast<const char*>(&n), 8);
      f.write(s.data(), static_cast<std::streamsize>(s.size()));
    }
    if (!f) throw IoError(fmt::format("save_optimizer_states: writing '{}' failed", tmp));
  }
  std::filesystem::rename(tmp, path);
}

void DistStore::load_optimizer_states(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError(fmt::format("load_optimizer_states: cannot read '{}'", path));
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto corrupt = [&](const std::string& why) {
    return IoError(
        fmt::format("load_optimizer_states: '{}' is not a distributed optimizer-state "
                    "file ({})",
                    path, why));
  };
  if (bytes.size() < 12 || std::memcmp(bytes.data(), kStatesMagic, 4) != 0)
    throw corrupt("bad magic");
  uint32_t version, servers;
  std::memcpy(&version, bytes.data() + 4, 4);
  std::memcpy(&servers, bytes.data() + 8, 4);
  if (version != kStatesVersion) throw corrupt(fmt::format("version {}", version));
  if (static_cast<int>(servers) != node_->num_servers())
    throw InvalidArgument(fmt::format(
        "load_optimizer_states: '{}' was saved by a job with {} servers; this job has {}", path,
        servers, node_->num_servers()));
  std::vector<std::string> per_server;
  size_t at = 12;
  for (uint32_t s = 0; s < servers; ++s) {
    uint64_t n;
    if (at + 8 > bytes.size()) throw corrupt("truncated");
    std::memcpy(&n, bytes.data() + at, 8);
    at += 8;
    if (n > bytes.size() - at) throw corrupt("truncated");
    per_server.emplace_back(bytes.substr(at, n));
    at += n;
  }
  wait_all();
  command_all(static_cast<uint64_t>(ps::Command::kLoadStates), per_server);
}

void DistStore::set_gradient_compression(const std::map<std::string, std::string>& params) {
  auto type = params.find("type");
  std::string t = type == params.end() ? "none" : type->second;
  std::optional<float> threshold;
  if (t == "2bit") {
    float v = 0.5f;
    if (auto it = params.find("threshold"); it != params.end()) {
      try {
        v = std::stof(it->second);
      } catch (...) {
        throw InvalidArgument(
            fmt::format("gradient compression threshold '{}' is not a number", it->second));
      }
    }
    compress::TwoBitCodec check(v);  // InvalidArgument unless > 0
    threshold = v;
  } else if (t != "none") {
    throw InvalidArgument(
        fmt::format("gradient compression type '{}' is not supported; use '2bit' or 'none'", t));
  }
  for (const auto& [k, v] : params)
    if (k != "type" && k != "threshold")
      throw InvalidArgument(
          fmt::format("unknown gradient compression parameter '{}'; valid: type, threshold", k));
  std::lock_guard lock(mu_);
  compression_threshold_ = threshold;
}

}  // namespace pushpull
