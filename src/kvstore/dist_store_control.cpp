// SPDX-License-Identifier: Apache-2.0
// The DistStore's control operations: commands to every server (mode,
// optimizer, states) and gradient compression settings. The data path (init,
// push, pull) is in dist_store_data.cpp.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "base/executor.h"
#include "base/file_auth.h"
#include "base/private_file.h"
#include "kvstore/dist_store.h"
#include "kvstore/states_file.h"
#include "ps/protocol.h"
#include "transport/wire.h"

namespace pushpull {

void DistStore::command_all(uint64_t command, const std::vector<std::string>& payloads,
                            std::vector<std::string>* answers) {
  int servers = node_->num_servers();
  auto done = std::make_shared<Completion>(servers);
  if (answers) answers->assign(static_cast<size_t>(servers), {});
  for (int s = 0; s < servers; ++s) {
    auto text = std::make_shared<std::string>(payloads.size() == 1 ? payloads[0] : payloads.at(s));
    transport::Header h{.type = ps::msg::kCommand, .key = command};
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
  // The user's checkpoint key (base/file_auth.h), read before anything is
  // asked of the servers: an unusable secret file fails here.
  const base::FileKey key = base::checkpoint_key(node_->options().kvstore.file_key_env);
  wait_all();
  std::vector<std::string> states;
  command_all(static_cast<uint64_t>(ps::Command::kSaveStates), {""}, &states);
  // Tagged with the key (kv/states_file.h), then an O_EXCL temporary renamed
  // over `path` (base/private_file.h): 0600, never through a symlink, never
  // over another user's file.
  base::write_private_file(path, kv::encode_states_file(states, key), "save_optimizer_states");
}

void DistStore::load_optimizer_states(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError(fmt::format("load_optimizer_states: cannot read '{}'", path));
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Authenticated and decoded whole before anything is sent: a file of
  // another key, modified or torn is refused here (kv/states_file.h).
  const base::FileKey key = base::checkpoint_key(node_->options().kvstore.file_key_env);
  std::vector<std::string> per_server =
      kv::decode_states_file(bytes, path, node_->num_servers(), key);
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
