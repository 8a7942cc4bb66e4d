// SPDX-License-Identifier: Apache-2.0
#include "launch/hostfile.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::launch {
namespace {

bool parse_int(std::string_view text, int lo, int hi, int* out) {
  if (text.empty() || text.size() > 9) return false;
  int v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r'))
      ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
      ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

Status bad(std::string why) {
  return {ErrorCode::kInvalidArgument, std::move(why)};
}

// Parses "host", "host:port", "[v6]" or "[v6]:port" (InvalidArgument with why not).
Status parse_host(std::string_view word, HostEntry* e) {
  std::string_view host = word, port;
  if (word.front() == '[') {
    auto close = word.find(']');
    if (close == std::string_view::npos) return bad("missing ']' after an IPv6 address");
    host = word.substr(1, close - 1);
    auto rest = word.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad("expected ':port' after ']'");
      port = rest.substr(1);
      if (port.empty()) return bad("empty ssh port after ':'");
    }
  } else if (auto colon = word.find(':'); colon != std::string_view::npos) {
    if (word.find(':', colon + 1) != std::string_view::npos)
      return bad("an IPv6 address must be written in brackets, e.g. [fe80::1]:22");
    host = word.substr(0, colon);
    port = word.substr(colon + 1);
    if (port.empty()) return bad("empty ssh port after ':'");
  }
  if (Status st = check_host_name(host); !st) return st;
  if (!port.empty() && !parse_int(port, 1, 65535, &e->ssh_port))
    return bad(fmt::format("ssh port '{}' is not a number in 1..65535", port));
  e->host = std::string(host);
  return {};
}

}  // namespace

Status check_host_name(std::string_view host) {
  if (host.empty()) return bad("empty host name");
  if (host.front() == '-')
    return bad(
        fmt::format("host name '{}' starts with '-' (ssh would read it as an option)", host));
  for (char c : host) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
              c == '-' || c == '[' || c == ']' || c == '@';
    if (!ok)
      return bad(fmt::format(
          "host name '{}' contains the character '{}' (allowed: letters, digits and . _ : - [ ] "
          "@)",
          host, c));
  }
  if (auto at = host.find('@');
      at != std::string_view::npos && at + 1 < host.size() && host[at + 1] == '-')
    return bad(fmt::format("host name '{}' starts with '-' after the user name", host));
  return {};
}

std::vector<HostEntry> parse_hostfile(std::string_view text, std::string_view source) {
  std::vector<HostEntry> hosts;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    auto words = split_words(line);
    if (words.empty()) continue;
    auto fail = [&](const std::string& why) {
      throw InvalidArgument(fmt::format(
          "hostfile {} line {}: {} (expected 'host[:sshport] [slots=K]')", source, line_no, why));
    };
    HostEntry e;
    if (Status st = parse_host(words[0], &e); !st) fail(st.message());
    for (size_t i = 1; i < words.size(); ++i) {
      auto w = words[i];
      if (w.starts_with("slots=")) {
        if (!parse_int(w.substr(6), 1, 1 << 20, &e.slots))
          fail(fmt::format("'{}' needs a positive whole number of slots", w));
      } else {
        fail(fmt::format("unknown field '{}'", w));
      }
    }
    hosts.push_back(std::move(e));
    if (nl == text.size()) break;
  }
  if (hosts.empty()) throw InvalidArgument(fmt::format("hostfile {} lists no host", source));
  return hosts;
}

std::vector<HostEntry> read_hostfile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InvalidArgument(fmt::format("cannot read hostfile {}: it is a directory", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    throw InvalidArgument(
        fmt::format("cannot read hostfile {}: {}", path, err ? std::strerror(err) : "open failed"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InvalidArgument(fmt::format("cannot read hostfile {}: read error", path));
  return parse_hostfile(text.str(), path);
}

}  // namespace pushpull::launch
