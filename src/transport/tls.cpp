// SPDX-License-Identifier: Apache-2.0
#include "transport/tls.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::transport {
namespace {

constexpr char kIdentity[] = "pushpull";
constexpr char kKeyLabel[] = "pushpull tls 1.3 psk v1";
// TLS_AES_128_GCM_SHA256: AES-NI makes it the cheapest suite on x86; its
// hash (SHA-256) is the one the PSK is bound to.
constexpr unsigned char kCipherId[2] = {0x13, 0x01};
// Ciphertext a link may hold unsent before sendv() stops taking plaintext.
constexpr size_t kMaxBacklog = 256 << 10;
// Plaintext per SSL_write: several full records (16 KiB each) per call.
constexpr size_t kWriteChunk = 64 << 10;
// Pieces smaller than a record are gathered into one record.
constexpr size_t kRecord = 16 << 10;
// With read-ahead, one read() takes up to this much ciphertext.
constexpr size_t kReadBuffer = 128 << 10;

std::string ssl_reason() {
  unsigned long e = ERR_peek_last_error();
  if (e == 0) return "no detail from libssl";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

[[noreturn]] void ssl_fail(const char* what) {
  std::string why = ssl_reason();
  ERR_clear_error();
  throw Internal(fmt::format("TLS setup failed: {}: {}", what, why));
}

SSL_SESSION* psk_session(SSL* ssl) {
  const auto* ctx = static_cast<const TlsContext*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kCipherId);
  if (ctx == nullptr || cipher == nullptr) return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(s, ctx->key().data(), ctx->key().size()) != 1 ||
      SSL_SESSION_set_cipher(s, cipher) != 1 ||
      SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen,
            SSL_SESSION** sess) {
  *sess = nullptr;
  if (md != nullptr && md != EVP_sha256()) return 1;  // a suite the key is not for
  *sess = psk_session(ssl);
  if (*sess == nullptr) return 0;
  *id = reinterpret_cast<const unsigned char*>(kIdentity);
  *idlen = sizeof kIdentity - 1;
  return 1;
}

int find_psk(SSL* ssl, const unsigned char* identity, size_t len, SSL_SESSION** sess) {
  *sess = nullptr;
  // Another identity: no key (the handshake then fails: no certificate).
  if (len != sizeof kIdentity - 1 || std::memcmp(identity, kIdentity, len) != 0) return 1;
  *sess = psk_session(ssl);
  return *sess != nullptr ? 1 : 0;
}

SSL_CTX* make_ctx(bool server, const TlsContext* owner) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) ssl_fail("SSL_CTX_new");
  SSL_CTX_set_app_data(ctx, const_cast<TlsContext*>(owner));
  bool ok = SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1 &&
            SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) == 1 &&
            SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256") == 1;
  if (!ok) {
    SSL_CTX_free(ctx);
    ssl_fail("configuring TLS 1.3");
  }
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, kReadBuffer);
  if (server) {
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_psk_find_session_callback(ctx, find_psk);
  } else {
    SSL_CTX_set_psk_use_session_callback(ctx, use_psk);
  }
  return ctx;
}

// The write side of every link: ciphertext goes into the link's backlog
// (TlsLink::out_), so a record libssl produced is never half in its hands.
BIO_METHOD* sink_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "pushpull tls out");
    BIO_meth_set_write_ex(m, [](BIO* b, const char* data, size_t n, size_t* written) {
      auto* out = static_cast<std::vector<unsigned char>*>(BIO_get_data(b));
      out->insert(out->end(), data, data + n);
      *written = n;
      return 1;
    });
    BIO_meth_set_ctrl(
        m, [](BIO*, int cmd, long, void*) -> long { return cmd == BIO_CTRL_FLUSH ? 1 : 0; });
    BIO_meth_set_create(m, [](BIO* b) {
      BIO_set_init(b, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

}  // namespace

TlsContext::TlsContext(const std::string& job_id, const std::string& secret) {
  if (secret.empty())
    throw InvalidArgument(
        "PUSHPULL_TLS=1 needs a job secret (the TLS key is derived from it); unset "
        "PUSHPULL_ALLOW_INSECURE or set PUSHPULL_JOB_SECRET");
  std::string msg = std::string(kKeyLabel) + '\0' + job_id;
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), key_.data(),
           &len) == nullptr ||
      len != key_.size())
    ssl_fail("deriving the key");
  client_ = make_ctx(false, this);
  try {
    server_ = make_ctx(true, this);
  } catch (...) {
    SSL_CTX_free(client_);
    throw;
  }
}

TlsContext::~TlsContext() {
  SSL_CTX_free(client_);
  SSL_CTX_free(server_);
  OPENSSL_cleanse(key_.data(), key_.size());
}

std::shared_ptr<const TlsContext> tls_context(const NetOptions& net) {
  if (!net.tls) return nullptr;
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::shared_ptr<const TlsContext>> cache;
  std::lock_guard lock(mu);
  auto& ctx = cache[{net.job_id, net.job_secret}];
  if (!ctx) ctx = std::make_shared<const TlsContext>(net.job_id, net.job_secret);
  return ctx;
}

TlsLink::TlsLink(std::shared_ptr<const TlsContext> ctx, int fd, Side side)
    : ctx_(std::move(ctx)), fd_(fd) {
  // libssl reads the socket itself: a blocking one would stall the
  // handshake with its first flight still in our backlog.
  if (int fl = ::fcntl(fd, F_GETFL); fl >= 0 && !(fl & O_NONBLOCK))
    ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  ssl_ = SSL_new(side == Side::kServer ? ctx_->server() : ctx_->client());
  if (ssl_ == nullptr) ssl_fail("SSL_new");
  BIO* in = BIO_new_socket(fd, BIO_NOCLOSE);
  BIO* out = BIO_new(sink_method());
  if (in == nullptr || out == nullptr) {
    BIO_free(in);
    BIO_free(out);
    SSL_free(ssl_);
    ssl_fail("BIO_new");
  }
  BIO_set_data(out, &out_);
  SSL_set_bio(ssl_, in, out);  // the SSL owns both
  if (side == Side::kServer)
    SSL_set_accept_state(ssl_);
  else
    SSL_set_connect_state(ssl_);
  gather_.reserve(kRecord);
}

TlsLink::~TlsLink() {
  SSL_free(ssl_);
}

bool TlsLink::established() const {
  std::lock_guard lock(mu_);
  return established_;
}

bool TlsLink::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

std::string TlsLink::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

TlsLink::Step TlsLink::handshake() {
  std::lock_guard lock(mu_);
  if (established_) return Step::kDone;
  ERR_clear_error();
  int r = SSL_do_handshake(ssl_);
  int err = r == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
  std::string reason = err == SSL_ERROR_SSL ? ssl_reason() : std::string();
  const int saved = errno;
  // Whatever libssl produced goes out, a fatal alert included, so the peer
  // learns why too.
  if (flush_locked() < 0 && err == SSL_ERROR_NONE) {
    error_ = fmt::format("TLS handshake: send failed: {}", std::strerror(errno));
    return Step::kFailed;
  }
  if (r == 1) {
    established_ = true;
    return Step::kDone;
  }
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return Step::kWaiting;
  refused_ = err == SSL_ERROR_SSL;
  if (err == SSL_ERROR_SSL)
    error_ = fmt::format(
        "TLS handshake failed ({}): the peer does not run with PUSHPULL_TLS=1 or does not know "
        "this job's secret",
        reason);
  else if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && saved == 0))
    error_ = "TLS handshake: the peer closed the connection";
  else
    error_ = fmt::format("TLS handshake: {}", std::strerror(saved));
  ERR_clear_error();
  return Step::kFailed;
}

ssize_t TlsLink::fail_io(int ssl_error, size_t moved, const char* op) {
  if (moved > 0) return static_cast<ssize_t>(moved);
  if (ssl_error == SSL_ERROR_WANT_READ || ssl_error == SSL_ERROR_WANT_WRITE) {
    errno = EAGAIN;
  } else if (ssl_error == SSL_ERROR_ZERO_RETURN) {
    return 0;
  } else if (ssl_error == SSL_ERROR_SYSCALL) {
    if (errno == 0) return 0;  // the peer closed without a close_notify
  } else {
    error_ = fmt::format("TLS {} failed: {}", op, ssl_reason());
    errno = EPROTO;
  }
  ERR_clear_error();
  return -1;
}

ssize_t TlsLink::readv(const iovec* iov, int count) {
  std::lock_guard lock(mu_);
  size_t moved = 0;
  for (int i = 0; i < count; ++i) {
    auto* p = static_cast<unsigned char*>(iov[i].iov_base);
    size_t left = iov[i].iov_len;
    while (left > 0) {
      ERR_clear_error();
      errno = 0;
      size_t got = 0;
      int r = SSL_read_ex(ssl_, p, left, &got);
      if (r != 1) return fail_io(SSL_get_error(ssl_, r), moved, "receive");
      p += got;
      left -= got;
      moved += got;
    }
  }
  return static_cast<ssize_t>(moved);
}

ssize_t TlsLink::recv(void* dst, size_t n) {
  iovec v{dst, n};
  return readv(&v, 1);
}

int TlsLink::flush_locked() {
  while (out_off_ < out_.size()) {
    ssize_t w =
        ::send(fd_, out_.data() + out_off_, out_.size() - out_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
    out_off_ += static_cast<size_t>(w);
  }
  out_.clear();
  out_off_ = 0;
  return 1;
}

int TlsLink::flush() {
  std::lock_guard lock(mu_);
  return flush_locked();
}

bool TlsLink::output_pending() const {
  std::lock_guard lock(mu_);
  return out_off_ < out_.size();
}

bool TlsLink::input_buffered() const {
  std::lock_guard lock(mu_);
  return SSL_has_pending(ssl_) == 1;
}

bool TlsLink::write_record(const void* data, size_t n) {
  ERR_clear_error();
  size_t written = 0;
  if (SSL_write_ex(ssl_, data, n, &written) == 1 && written == n) return true;
  error_ = fmt::format("TLS send failed: {}", ssl_reason());
  ERR_clear_error();
  return false;
}

ssize_t TlsLink::sendv(const iovec* iov, int count) {
  std::lock_guard lock(mu_);
  if (flush_locked() < 0) return -1;
  size_t taken = 0;
  auto backlog = [this] { return out_.size() - out_off_; };
  for (int i = 0; i < count && backlog() < kMaxBacklog; ++i) {
    const auto* p = static_cast<const unsigned char*>(iov[i].iov_base);
    size_t left = iov[i].iov_len;
    while (left > 0 && backlog() < kMaxBacklog) {
      if (!gather_.empty() || left < kRecord) {
        // Top the gathered record up to a full one, then write it.
        size_t k = std::min(left, kRecord - gather_.size());
        gather_.insert(gather_.end(), p, p + k);
        p += k;
        left -= k;
        taken += k;
        if (gather_.size() == kRecord) {
          if (!write_record(gather_.data(), gather_.size())) return errno = EPROTO, -1;
          gather_.clear();
        }
        continue;
      }
      size_t k = std::min(left, kWriteChunk);
      if (!write_record(p, k)) return errno = EPROTO, -1;
      p += k;
      left -= k;
      taken += k;
    }
  }
  if (!gather_.empty()) {
    if (!write_record(gather_.data(), gather_.size())) return errno = EPROTO, -1;
    gather_.clear();
  }
  if (flush_locked() < 0 && taken == 0) return -1;
  if (taken == 0) {
    errno = EAGAIN;
    return -1;
  }
  return static_cast<ssize_t>(taken);
}

ssize_t TlsLink::send(const void* data, size_t n) {
  iovec v{const_cast<void*>(data), n};
  return sendv(&v, 1);
}

bool looks_like_tls(const unsigned char* bytes, size_t n) {
  return n >= 2 && bytes[0] == 0x16 && bytes[1] == 0x03;
}

}  // namespace pushpull::transport
