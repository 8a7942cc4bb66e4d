// SPDX-License-Identifier: Apache-2.0
// The DistStore's control operations: commands to every server (mode,
// optimizer, states) and gradient compression settings. The data path (init,
// push, pull) is in dist_store_data.cpp.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "base/executor.h"
#include "base/private_file.h"
#include "kvstore/dist_store.h"
#include "net/wire.h"
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
    request(s, h, text->data(), text->size(), text, done, 0, std::move(on_data), true);
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
  if (rejoining_) {
    // A restarted worker: the servers have it already, unless worker 0 died
    // before sending it; its replacement sends it to the servers that lack
    // it (the others keep theirs, with the optimizer's states).
    if (rank() == 0)
      command_all(static_cast<uint64_t>(ps::Command::kSetOptimizerIfAbsent), {spec.to_string()});
    return;
  }
  Status sent;
  if (rank() == 0) {
    try {
      command_all(static_cast<uint64_t>(ps::Command::kSetOptimizer), {spec.to_string()});
    } catch (...) {
      sent = Status::from_current_exception();
    }
  }
  workers_barrier();
  sent.raise();
}

void DistStore::save_optimizer_states(const std::string& path) {
  wait_all();
  std::vector<std::string> states;
  command_all(static_cast<uint64_t>(ps::Command::kSaveStates), {""}, &states);
  net::Writer w;
  w.bytes(std::as_bytes(std::span(kStatesMagic, 4)));
  w.u<uint32_t>(kStatesVersion).u<uint32_t>(static_cast<uint32_t>(states.size()));
  for (const auto& s : states)
    w.str<uint64_t>(s);
  // An O_EXCL temporary renamed over `path` (base/private_file.h): 0600,
  // never through a symlink, never over another user's file.
  base::write_private_file(
      path, std::string_view(reinterpret_cast<const char*>(w.data().data()), w.data().size()),
      "save_optimizer_states");
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
  // Little-endian (net/wire.h): magic, u32 version, u32 servers, then per
  // server a u64-length-prefixed blob, nothing after.
  net::Reader r(std::as_bytes(std::span(bytes.data(), bytes.size())));
  auto magic = r.view(4);
  if (!r.ok() || std::memcmp(magic.data(), kStatesMagic, 4) != 0) throw corrupt("bad magic");
  uint32_t version = r.u<uint32_t>(), servers = r.u<uint32_t>();
  if (!r.ok()) throw corrupt("truncated");
  if (version != kStatesVersion) throw corrupt(fmt::format("version {}", version));
  if (static_cast<int>(servers) != node_->num_servers())
    throw InvalidArgument(fmt::format(
        "load_optimizer_states: '{}' was saved by a job with {} servers; this job has {}", path,
        servers, node_->num_servers()));
  std::vector<std::string> per_server;
  for (uint32_t s = 0; s < servers && r.ok(); ++s)
    per_server.push_back(r.str<uint64_t>(bytes.size()));
  if (!r.ok()) throw corrupt("truncated");
  if (!r.done()) throw corrupt("trailing bytes");
  wait_all();
  command_all(static_cast<uint64_t>(ps::Command::kLoadStates), per_server);
}

void DistStore::set_gradient_compression(const std::map<std::string, std::string>& params) {
  compress::Settings settings = compress::parse_settings(params);
  auto compressor = settings.enabled() ? std::make_shared<compress::Compressor>(settings) : nullptr;
  std::lock_guard lock(mu_);
  compressor_ = std::move(compressor);  // new settings start from zero residuals
}

}  // namespace pushpull
