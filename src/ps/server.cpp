// SPDX-License-Identifier: Apache-2.0
#include "ps/server.h"

#include "ps/server_shares.h"

#include <algorithm>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "ps/checkpoint.h"
#include "ps/protocol.h"
#include "pushpull/checked.h"
#include "pushpull/log.h"

namespace pushpull::ps {

namespace {
// Largest slice begin / element count a request may name.
constexpr uint64_t kMaxElements = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

int default_threads(int configured) {
  if (configured > 0) return configured;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 4);
}
}  // namespace

Server::Server(cluster::Node& node)
    : node_(node),
      threads_(default_threads(node.options().kvstore.server_threads)),
      gate_(std::make_shared<Gate>()) {
  if (checkpointing()) {
    // The user's key, not the job secret (a fresh one per launched job).
    // A host whose key differs from the launcher's stops here, before it
    // writes checkpoints nobody could resume from (base::check_key_id).
    const Environment& env = node.options().kvstore.file_key_env;
    checkpoint_key_ = base::checkpoint_key(env);
    base::check_key_id(checkpoint_key_, env, "server");
  }
  set_mode(Mode{});
  node_.on_placement([gate = gate_, this](const cluster::Placement& p) {
    if (!gate->enter()) return;
    struct Leave {
      Gate& g;
      ~Leave() { g.leave(); }
    } leave{*gate};
    on_placement(p);
  });
  // The handler outlives this Server inside the node's transport: it reaches
  // the Server only through the gate, which ~Server closes first. The whole PS
  // type range is ours, so an unknown PS type is answered, not a closed link.
  node_.set_handler(transport::msg::kPsFirst, transport::msg::kPsLast,
                    [gate = gate_, this](transport::Message&& m) {
                      if (!gate->enter()) return;  // the server is going away: drop the request
                      struct Leave {
                        Gate& g;
                        ~Leave() { g.leave(); }
                      } leave{*gate};
                      on_message_guarded(std::move(m));
                    });
}

Server::~Server() {
  // Stop deliveries and wait out the one in progress, so no I/O-thread call
  // holds the store or this Server past this point; then drain the store
  // (its queued work still answers through node_, which outlives us).
  gate_->close();
  std::shared_ptr<ServerStore> last;
  {
    std::lock_guard lock(mu_);
    last = std::move(store_);
  }
  last.reset();
}

bool Server::Gate::enter() {
  std::lock_guard lock(mu);
  if (closed) return false;
  ++active;
  return true;
}

void Server::Gate::leave() {
  std::lock_guard lock(mu);
  if (--active == 0) cv.notify_all();
}

void Server::Gate::close() {
  std::unique_lock lock(mu);
  closed = true;
  cv.wait(lock, [&] { return active == 0; });
}

void Server::on_message_guarded(transport::Message&& m) {
  // A bad request is answered with an error and never escapes onto the I/O
  // thread (where an exception would end the process).
  cluster::NodeAddress from = cluster::Node::sender(m.header);
  RequestMeta meta{from.rank, m.header.request_id, m.header.key};
  try {
    on_message(std::move(m));
  } catch (...) {
    Status st = Status::from_current_exception();
    PP_WARN("parameter-server request from {} failed: {}", from.describe(), st.to_string());
    if (from.role != Role::kWorker) return;
    try {
      reply(meta, st, DType::kUInt8, {});
    } catch (...) {
      PP_WARN("could not answer {}: {}", from.describe(),
              Status::from_current_exception().to_string());
    }
  }
}

void Server::set_mode(const Mode& mode) {
  const bool sync = mode.sync;
  ServerStoreConfig config{node_.num_workers(), sync, threads_, node_.rank()};
  config.replicate = node_.ps_replicas() > 0;
  config.lendable_values = config.replicate && lending();
  if (sync) {  // worker 0's setting (docs/ps.md "Backup workers")
    config.backup_workers = mode.backup_workers;
    config.backup_max_late = mode.backup_max_late;
  }
  const KVStoreOptions& kv = node_.options().kvstore;
  config.checkpoint_dir = kv.checkpoint_dir;
  if (!config.checkpoint_dir.empty()) config.checkpoint_every = kv.checkpoint_every;
  config.num_servers = node_.num_servers();
  config.checkpoint_key = checkpoint_key_;
  if (!sync && config.checkpoint_every > 0)
    PP_WARN("server {}: dist_async jobs write no checkpoints (rounds are per push)", node_.rank());
  auto fresh = std::make_shared<ServerStore>(config, *this);
  std::lock_guard lock(mu_);
  store_ = std::move(fresh);
  mode_ = mode;
}

void Server::restore_checkpoint() {
  const std::string& dir = node_.options().kvstore.resume_dir;
  if (dir.empty()) return;
  std::lock_guard lock(mu_);
  if (restored_store_.lock() == store_) return;
  const int64_t round = node_.options().kvstore.resume_round;
  const int servers = node_.num_servers(), me = node_.rank();
  // Its own ranges, and those it backs up (the homes whose chain holds it):
  // if a home dies before its first round, worker 0's re-sent init reaches
  // this backup, which must hold the checkpoint's value then, not create the
  // range from the program's initial one.
  const int replicas = std::min(node_.ps_replicas(), servers - 1);
  if (resume_.empty()) {
    for (int i = 0; i <= replicas; ++i) {
      const int home = ((me - i) % servers + servers) % servers;
      const std::string path = checkpoint_path(dir, round, home);
      auto c = read_checkpoint(path, {servers, home, node_.num_workers()}, checkpoint_key_);
      if (c.round != round)
        throw IoError(fmt::format("checkpoint '{}': holds round {}, not {}", path, c.round, round));
      PP_INFO("server {}: resuming from checkpoint {} (round {}, {} parts{})", me, path, round,
              c.parts.size(), i ? ", as their backup" : "");
      resume_.emplace_back(path, std::make_shared<const Checkpoint>(std::move(c)));
    }
  }
  for (const auto& [path, c] : resume_)
    store_->restore(*c, path);
  restored_store_ = store_;
}

void Server::reply(const RequestMeta& to, const Status& status, DType dtype,
                   std::span<const std::byte> data, std::shared_ptr<void> owner) {
  // A request of a worker's earlier process (detached by a rejoin): its
  // replacement does not know the id.
  if (to.request_id == 0) return;
  transport::Header h;
  h.request_id = to.request_id;
  h.key = to.key;
  h.dtype = static_cast<uint32_t>(dtype);
  if (!status.is_ok()) {
    h.type = msg::kError;
    h.flags = static_cast<uint32_t>(status.code());
    const std::string& text = status.message();
    node_.send_copy(Role::kWorker, to.worker, h, text.data(), text.size());
    return;
  }
  h.type = msg::kReply;
  if (!owner || data.size() <= 4096) {
    node_.send_copy(Role::kWorker, to.worker, h, data.data(), data.size());
    return;
  }
  // Zero-copy: `owner` keeps the bytes alive and unchanged until written.
  node_.send(Role::kWorker, to.worker, h, data.data(), data.size(), [owner](const Status& s) {
    if (!s.is_ok()) PP_DEBUG("reply not delivered: {}", s.to_string());
  });
}

void Server::on_message(transport::Message&& m) {
  cluster::NodeAddress from = cluster::Node::sender(m.header);
  if (from.role == Role::kServer && node_.ps_replicas() > 0 && from.rank >= 0 &&
      from.rank < node_.num_servers() && from.rank != node_.rank())
    return on_server_message(from, std::move(m));
  if (from.role != Role::kWorker) {
    PP_WARN("ignoring parameter-server message type {} from {}", m.header.type, from.describe());
    return;
  }
  if (from.rank < 0 || from.rank >= node_.num_workers()) {
    PP_WARN("ignoring parameter-server message type {} from unknown {}", m.header.type,
            from.describe());
    return;
  }
  if (node_.ps_replicas() > 0) {
    uint64_t want = epoch_of_flags(m.header.flags);
    // A restarted server: a request stamped with an epoch before the one it
    // joined at was meant for its predecessor, as this range's primary then.
    // Applied here (a backup, catching up or rejoined late) it would be lost
    // (found by the simulation, seed 3716); the worker re-sends it to the
    // new primary when it applies the placement that failed the predecessor
    // over.
    if (node_.incarnation() > 0 && want < node_.joined_epoch() % kWrap) {
      PP_DEBUG(
          "server {}: dropping a request of worker {} from placement epoch {}, before this "
          "process joined (epoch {})",
          node_.rank(), from.rank, want, node_.joined_epoch());
      return;
    }
    // A worker that already knows a newer placement: wait for the scheduler's
    // word to us (it is on its way) so we know which ranges we now lead.
    if (want > node_.placement_epoch() % kWrap) {
      std::lock_guard lock(repl_mu_);
      if (want > node_.placement_epoch() % kWrap) {
        future_.push_back(std::move(m));
        return;
      }
    }
  }
  RequestMeta meta{from.rank, m.header.request_id, m.header.key};
  auto reject = [&](const Status& s) { reply(meta, s, DType::kUInt8, {}); };
  if (m.header.type == msg::kCommand) return on_command(meta, std::move(m));
  // A push's dtype field carries its sequence number in bits 8..31.
  const uint32_t seq = m.header.type == msg::kPush ? seq_of_dtype(m.header.dtype) : 0;
  if (m.header.type == msg::kPush) m.header.dtype &= 0xff;
  const bool dtype_ok =
      m.header.dtype <= 0xff && is_valid_dtype(static_cast<uint8_t>(m.header.dtype));
  if (!dtype_ok && m.header.type != msg::kPull)
    return reject(Status(ErrorCode::kProtocolError, fmt::format("bad dtype {}", m.header.dtype)));
  auto dtype = static_cast<DType>(m.header.dtype);
  // Slice begin and element count travel as u64; a slice of a real value fits int64.
  if (m.header.offset > kMaxElements || m.header.length > kMaxElements)
    return reject(Status(ErrorCode::kProtocolError,
                         fmt::format("slice (begin {}, count {}) of key id {} is out of range",
                                     m.header.offset, m.header.length, m.header.key)));
  const PartId part{m.header.key, static_cast<int64_t>(m.header.offset)};
  auto owner = std::make_shared<transport::Buffer>(std::move(m.payload));
  std::shared_ptr<ServerStore> s = store();
  switch (m.header.type) {
    case msg::kInit: {
      std::string name;
      std::span<const std::byte> value;
      int32_t home = -1;
      if (Status st = decode_init({owner->data(), owner->size()}, &name, &value, &home); !st)
        return reject(st);
      if (home < -1 || home >= node_.num_servers())
        return reject(Status(ErrorCode::kProtocolError,
                             fmt::format("init of key {}: home server {} is not one of the {}",
                                         name, home, node_.num_servers())));
      auto count = static_cast<int64_t>(m.header.length);
      size_t want = 0;
      if (!checked_bytes(count, dtype_size(dtype), &want) || value.size() != want)
        return reject(Status(ErrorCode::kProtocolError,
                             fmt::format("init of key {}: {} bytes for {} elements of {}", name,
                                         value.size(), count, dtype_name(dtype))));
      ArrayView view(const_cast<std::byte*>(value.data()), dtype, Shape{count});
      s->init(meta, part, std::move(name), Payload{view, owner}, home);
      return;
    }
    case msg::kPush: {
      bool compressed = (m.header.flags & msg::kFlagCompressed) != 0;
      int64_t n = compressed ? static_cast<int64_t>(owner->size())
                             : static_cast<int64_t>(owner->size() / dtype_size(dtype));
      if (!compressed && owner->size() % dtype_size(dtype) != 0)
        return reject(Status(ErrorCode::kProtocolError, "push payload is not whole elements"));
      ArrayView view(owner->data(), compressed ? DType::kUInt8 : dtype, Shape{n});
      meta.pull_back = (m.header.flags & msg::kFlagPullBack) != 0;
      s->push(meta, part, Payload{view, owner}, compressed, seq);
      return;
    }
    case msg::kPull: {
      std::vector<Range> ranges;
      if (m.header.flags & msg::kFlagRejoin) return s->rejoin(meta, part);
      if (Status st = decode_ranges({owner->data(), owner->size()}, &ranges); !st)
        return reject(st);
      s->pull(meta, part, std::move(ranges));
      return;
    }
    default:
      return reject(Status(ErrorCode::kProtocolError,
                           fmt::format("unexpected message type {} at a server", m.header.type)));
  }
}

void Server::on_command(const RequestMeta& meta, transport::Message&& m) {
  std::string text(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  auto s = store();
  switch (static_cast<Command>(m.header.key)) {
    case Command::kSetMode: {
      Mode want;
      if (Status st = decode_mode(text, &want); !st) return reply(meta, st, DType::kUInt8, {});
      if (!(want == mode())) {
        // A fresh store drops every key: only worker 0, and only before the
        // first init (as DistStore does), may switch.
        if (meta.worker != 0 || s->has_keys())
          return reply(meta,
                       Status(ErrorCode::kInvalidArgument,
                              fmt::format("worker {} asked to switch the servers to {} mode; only "
                                          "worker 0 may, before any key is initialised",
                                          meta.worker, text)),
                       DType::kUInt8, {});
        set_mode(want);
      } else if (!s->has_keys() && checkpointing()) {
        // The constructor's store predates registration (no rank yet), which
        // checkpoint files need: a fresh one, as for a mode switch.
        set_mode(want);
      }
      restore_checkpoint();  // throws: the error goes back to worker 0
      return reply(meta, Status::ok(), DType::kUInt8, {});
    }
    case Command::kSetOptimizerIfAbsent: {
      std::lock_guard lock(repl_mu_);
      if (!optimizer_spec_.empty()) return reply(meta, Status::ok(), DType::kUInt8, {});
    }
      [[fallthrough]];
    case Command::kSetOptimizer: {
      std::lock_guard lock(repl_mu_);
      optimizer_spec_ = text;
    }
      try {
        s->set_optimizer(meta, OptimizerSpec::parse(text));
      } catch (...) {
        reply(meta, Status::from_current_exception(), DType::kUInt8, {});
      }
      return;
    case Command::kSaveStates:
      return s->save_states(meta);
    case Command::kLoadStates:
      return s->load_states(meta, std::move(text));
  }
  reply(meta, Status(ErrorCode::kProtocolError, fmt::format("unknown command {}", m.header.key)),
        DType::kUInt8, {});
}

void run_server(Options options) {
  // A server waits for the job's end with no deadline of its own: the failure
  // detector (heartbeats) bounds that wait if anything dies.
  options.cluster.barrier_timeout = Millis(int64_t{30} * 24 * 3600 * 1000);  // 30 days
  cluster::Node node(options);
  Server server(node);
  try {
    node.start();
    PP_INFO("server {} of {} serving ({} workers)", node.rank(), node.num_servers(),
            node.num_workers());
    // Mixed placement: this server's links get windows in proportion to its
    // share, as the workers' links to it do (ps/server_shares.h).
    node.set_server_link_scale(
        link_scales(server_weights(options.kvstore.ps_server_weights, node.address_book())));
    if (node.incarnation() > 0) server.rejoin();  // restarted: fetch its key ranges
    // Serve until every worker has left; leaving only then keeps the server
    // under the scheduler's heartbeat watch for the whole job.
    node.wait_for_workers();
    node.shutdown();
  } catch (...) {
    // A failure: no handler may run while `server` is destroyed (the gate
    // covers requests; this also stops failure callbacks and heartbeats).
    node.stop_delivery();
    throw;
  }
}

}  // namespace pushpull::ps
