#include "ps/server.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "ps/protocol.h"
#include "pushpull/log.h"

namespace pushpull::ps {

namespace {
int default_threads(int configured) {
  if (configured > 0) return configured;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 4);
}
}  // namespace

Server::Server(cluster::Node& node)
    : node_(node), threads_(default_threads(node.options().kvstore.server_threads)) {
  set_mode(true);
  node_.set_handler(msg::kFirst, msg::kLast,
                    [this](net::Message&& m) { on_message(std::move(m)); });
}

Server::~Server() = default;

void Server::set_mode(bool sync) {
  ServerStoreConfig config{node_.num_workers(), sync, threads_, 0};
  auto fresh = std::make_shared<ServerStore>(config, *this);
  std::lock_guard lock(mu_);
  store_ = std::move(fresh);
}

void Server::reply(const RequestMeta& to, const Status& status, DType dtype,
                   std::span<const std::byte> data, std::shared_ptr<void> owner) {
  net::Header h;
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

void Server::on_message(net::Message&& m) {
  cluster::NodeAddress from = cluster::Node::sender(m.header);
  if (from.role != Role::kWorker) {
    PP_WARN("ignoring parameter-server message type {} from {}", m.header.type, from.describe());
    return;
  }
  RequestMeta meta{from.rank, m.header.request_id, m.header.key};
  auto reject = [&](const Status& s) { reply(meta, s, DType::kUInt8, {}); };
  if (m.header.type == msg::kCommand) return on_command(meta, std::move(m));
  if (!is_valid_dtype(static_cast<uint8_t>(m.header.dtype)) && m.header.type != msg::kPull)
    return reject(Status(ErrorCode::kProtocolError, fmt::format("bad dtype {}", m.header.dtype)));
  auto dtype = static_cast<DType>(m.header.dtype);
  const PartId part{m.header.key, static_cast<int64_t>(m.header.offset)};
  auto owner = std::make_shared<net::Buffer>(std::move(m.payload));
  std::shared_ptr<ServerStore> s = store();
  switch (m.header.type) {
    case msg::kInit: {
      std::string name;
      std::span<const std::byte> value;
      if (Status st = decode_init({owner->data(), owner->size()}, &name, &value); !st)
        return reject(st);
      auto count = static_cast<int64_t>(m.header.length);
      if (value.size() != static_cast<size_t>(count) * dtype_size(dtype))
        return reject(Status(ErrorCode::kProtocolError,
                             fmt::format("init of key {}: {} bytes for {} elements of {}", name,
                                         value.size(), count, dtype_name(dtype))));
      ArrayView view(const_cast<std::byte*>(value.data()), dtype, Shape{count});
      s->init(meta, part, std::move(name), Payload{view, owner});
      return;
    }
    case msg::kPush: {
      bool compressed = (m.header.flags & msg::kFlagCompressed) != 0;
      int64_t n = compressed ? static_cast<int64_t>(owner->size())
                             : static_cast<int64_t>(owner->size() / dtype_size(dtype));
      if (!compressed && owner->size() % dtype_size(dtype) != 0)
        return reject(Status(ErrorCode::kProtocolError, "push payload is not whole elements"));
      ArrayView view(owner->data(), compressed ? DType::kUInt8 : dtype, Shape{n});
      s->push(meta, part, Payload{view, owner}, compressed);
      return;
    }
    case msg::kPull: {
      std::vector<Range> ranges;
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

void Server::on_command(const RequestMeta& meta, net::Message&& m) {
  std::string text(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  auto s = store();
  switch (static_cast<Command>(m.header.key)) {
    case Command::kSetMode:
      if (text != "sync" && text != "async")
        return reply(meta, Status(ErrorCode::kInvalidArgument, "mode must be sync or async"),
                     DType::kUInt8, {});
      if ((text == "sync") != s->sync()) set_mode(text == "sync");
      return reply(meta, Status::ok(), DType::kUInt8, {});
    case Command::kSetOptimizer:
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
  node.start();
  PP_INFO("server {} of {} serving ({} workers)", node.rank(), node.num_servers(),
          node.num_workers());
  // Serve until every worker has left; leaving only then keeps the server
  // under the scheduler's heartbeat watch for the whole job.
  node.wait_for_workers();
  node.shutdown();
}

}  // namespace pushpull::ps
