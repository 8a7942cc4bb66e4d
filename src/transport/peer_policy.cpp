// SPDX-License-Identifier: Apache-2.0
#include "transport/peer_policy.h"

#include <arpa/inet.h>

#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/inproc/in_process_listeners.h"

namespace pushpull::transport {

bool is_loopback(const SockAddr& a) {
  if (a.family() == AF_UNIX) return true;  // the in-process medium: this very process
  if (a.family() == AF_INET) {
    uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr);
    return (ip >> 24) == 127;
  }
  if (a.family() == AF_INET6) {
    const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&ip)) return true;
    return IN6_IS_ADDR_V4MAPPED(&ip) && ip.s6_addr[12] == 127;
  }
  return false;
}

std::string host_of(const SockAddr& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.family() == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr, buf,
              sizeof buf);
  else if (a.family() == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, buf,
              sizeof buf);
  else if (a.family() == AF_UNIX)
    return std::string(kInProcessHost);
  else
    return "?";
  return buf;
}

bool is_local_peer(const SockAddr& peer, const std::vector<std::string>& local_hosts) {
  if (is_loopback(peer)) return true;
  std::string host = host_of(peer);
  if (host.rfind("::ffff:", 0) == 0) host = host.substr(7);  // IPv4-mapped
  for (const auto& h : local_hosts)
    if (h == host) return true;
  return false;
}

Status dial_refusal(const SockAddr& peer, const NetOptions& opts,
                    const std::vector<std::string>& local_hosts) {
  if (!opts.job_secret.empty() || opts.allow_insecure || is_local_peer(peer, local_hosts))
    return Status::ok();
  return {
      ErrorCode::kProtocolError,
      fmt::format(
          "this node has no job secret and so connects to this machine only, not to {}: without a "
          "secret nothing proves that a job member answers there; set the same PUSHPULL_JOB_SECRET "
          "(or PUSHPULL_JOB_SECRET_FILE) on every node (or PUSHPULL_ALLOW_INSECURE=1 on a trusted, "
          "isolated network)",
          host_of(peer))};
}

bool PendingLimit::admit(const std::string& host) {
  size_t& n = count_[host];
  if (n >= limit_) return false;
  ++n;
  return true;
}

void PendingLimit::release(const std::string& host) {
  auto it = count_.find(host);
  if (it == count_.end()) return;
  if (--it->second == 0) count_.erase(it);
}

size_t PendingLimit::pending(const std::string& host) const {
  auto it = count_.find(host);
  return it == count_.end() ? 0 : it->second;
}

Status peer_refusal(const SockAddr& peer, const NetOptions& opts,
                    const std::vector<std::string>& local_hosts) {
  if (!opts.job_secret.empty() || opts.allow_insecure || is_local_peer(peer, local_hosts))
    return Status::ok();
  return {ErrorCode::kProtocolError,
          fmt::format("this node has no job secret and so accepts connections from this machine "
                      "only, not from {}; set the same PUSHPULL_JOB_SECRET on every node (or "
                      "PUSHPULL_ALLOW_INSECURE=1 on a trusted, isolated network)",
                      host_of(peer))};
}

void warn_insecure_once(const NetOptions& opts) {
  if (!opts.job_secret.empty()) return;
  static std::once_flag once;
  std::call_once(once, [&] {
    if (opts.allow_insecure)
      PP_WARN(
          "INSECURE: no job secret and PUSHPULL_ALLOW_INSECURE=1: any machine that can reach "
          "this node's ports can join the job, read its data and stop it; set "
          "PUSHPULL_JOB_SECRET");
    else
      PP_WARN(
          "no job secret: accepting and opening connections to this machine only; set the same "
          "PUSHPULL_JOB_SECRET on every node to run across machines");
  });
}

std::string bind_host_for(const std::string& host, bool bind_any) {
  const bool v6 = host.find(':') != std::string::npos;
  if (bind_any || host.empty() || host == "0.0.0.0" || host == "::") return v6 ? "::" : "";
  if (host == "localhost") return "127.0.0.1";
  return host;
}

void RefusalLog::note(const std::string& peer_host, const std::string& message) {
  auto now = std::chrono::steady_clock::now();
  auto it = entries_.find(peer_host);
  if (it != entries_.end() && now - it->second.last < interval_) {
    ++it->second.suppressed;
    return;
  }
  if (it == entries_.end()) {
    // Bound the table: forget peers that have been quiet for an interval.
    if (entries_.size() >= 4096)
      std::erase_if(entries_, [&](const auto& e) { return now - e.second.last >= interval_; });
    if (entries_.size() >= 4096) return;  // a flood from many addresses: stay quiet
    it = entries_.emplace(peer_host, Entry{}).first;
  }
  if (it->second.suppressed > 0)
    PP_WARN("{} ({} more from {} not logged in the last {} s)", message, it->second.suppressed,
            peer_host, std::chrono::duration_cast<std::chrono::seconds>(interval_).count());
  else
    PP_WARN("{}", message);
  it->second.last = now;
  it->second.suppressed = 0;
}

}  // namespace pushpull::transport
