// A loopback HTTP/1.1 server for the remote source's tests: one object served with range requests, keep-alive
// connections (a thread each), an ETag per version, If-Match, and faults switched on by atomic fields, as
// FaultySource injects them into a local file. Not a general server: GET only, one object, 127.0.0.1 only.
#ifndef SAFETENSORS_TESTS_LOOPBACK_HTTP_H_
#define SAFETENSORS_TESTS_LOOPBACK_HTTP_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace safetensors::test {

class LoopbackHttp {
 public:
  // Serves `body` at `path` (any other path is 404).
  LoopbackHttp(std::string path, std::string body) : path_(std::move(path)), body_(std::move(body)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener_, 64) != 0 || ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("loopback server: " + std::string(std::strerror(errno)));
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~LoopbackHttp() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : workers_) t.join();
    for (int fd : open_) ::close(fd);
    ::close(listener_);
  }
  LoopbackHttp(const LoopbackHttp&) = delete;
  LoopbackHttp& operator=(const LoopbackHttp&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + path_; }
  std::string url_of(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }

  // A new version of the object (a new ETag), from the next request on.
  void replace(std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = std::move(body);
    ++version_;
  }

  // Faults. Each counts down: the next N requests get it.
  std::atomic<int> fail_with_503{0};
  std::atomic<int> cut_body_after_half{0};  // sends Content-Length for the range, then half of it, then closes
  std::atomic<int> stall{0};                // sends the headers, then nothing until the server stops
  // Every request answers this status (0: none), e.g. 403.
  std::atomic<int> status_override{0};
  // When true, If-Match is ignored (a server that does not support it).
  std::atomic<bool> ignore_if_match{false};
  // Requests whose Range starts at or past this offset get a new version first (-1: never): the object is
  // replaced in the middle of a load.
  std::atomic<std::int64_t> replace_at_offset{-1};

  // What was asked: (range start, range end inclusive) per GET of the object, and bytes of body sent.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ranges_;
  }
  std::uint64_t body_bytes_sent() const { return sent_.load(); }
  int connections() const { return connections_.load(); }
  int requests() const { return requests_.load(); }

 private:
  void accept_loop() {
    for (;;) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (stopping_) return;
        continue;
      }
      connections_.fetch_add(1);
      // Headers and body go out in two sends: without this Nagle holds the body for the client's delayed ACK.
      const int one = 1;
      (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> lock(mu_);
      open_.push_back(fd);
      workers_.emplace_back([this, fd] { serve(fd); });
    }
  }

  static bool send_all(int fd, const char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  static std::string header_value(const std::string& request, const std::string& name) {
    const auto at = request.find("\r\n" + name + ":");
    if (at == std::string::npos) return {};
    std::size_t begin = at + 3 + name.size();
    while (begin < request.size() && request[begin] == ' ') ++begin;
    return request.substr(begin, request.find("\r\n", begin) - begin);
  }

  static bool take(std::atomic<int>& counter) {
    int n = counter.load();
    while (n > 0 && !counter.compare_exchange_weak(n, n - 1)) {
    }
    return n > 0;
  }

  void serve(int fd) {
    std::string buffer;
    char chunk[4096];
    for (;;) {
      std::size_t end;
      while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t r = ::recv(fd, chunk, sizeof chunk, 0);
        if (r <= 0) return;
        buffer.append(chunk, static_cast<std::size_t>(r));
        if (static_cast<unsigned char>(buffer[0]) == 0x16) {  // a TLS ClientHello: this server speaks plain HTTP
          static constexpr char kBad[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
          send_all(fd, kBad, sizeof kBad - 1);
          ::shutdown(fd, SHUT_RDWR);
          return;
        }
      }
      const std::string request = buffer.substr(0, end + 2);
      buffer.erase(0, end + 4);
      requests_.fetch_add(1);
      if (!respond(fd, request)) {
        ::shutdown(fd, SHUT_RDWR);
        return;
      }
    }
  }

  // Answers one request; false to close the connection.
  bool respond(int fd, const std::string& request) {
    const std::string target = request.substr(4, request.find(' ', 4) - 4);
    auto simple = [&](int status, const std::string& text) {
      const std::string head = "HTTP/1.1 " + std::to_string(status) + " " + text + "\r\nContent-Length: 0\r\n\r\n";
      return send_all(fd, head.data(), head.size());
    };
    if (target.substr(0, target.find('?')) != path_) return simple(404, "Not Found");
    if (const int s = status_override.load(); s != 0) return simple(s, s == 403 ? "Forbidden" : "Error");
    if (take(fail_with_503)) return simple(503, "Service Unavailable");
    std::uint64_t first = 0, last = 0;
    const std::string range = header_value(request, "Range");
    bool ranged = false;
    if (range.rfind("bytes=", 0) == 0 && range.find('-') != std::string::npos) {
      first = std::strtoull(range.c_str() + 6, nullptr, 10);
      last = std::strtoull(range.c_str() + range.find('-') + 1, nullptr, 10);
      ranged = true;
    }
    std::string body;
    std::string etag;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::int64_t at = replace_at_offset.load();
      if (ranged && at >= 0 && first >= static_cast<std::uint64_t>(at)) {
        replace_at_offset = -1;
        ++version_;
        body_[body_.size() - 1] = static_cast<char>(body_[body_.size() - 1] ^ 1);
      }
      body = body_;
      etag = "\"v" + std::to_string(version_) + "\"";
      if (ranged) ranges_.emplace_back(first, last);
    }
    const std::string if_match = header_value(request, "If-Match");
    if (!if_match.empty() && if_match != etag && !ignore_if_match) return simple(412, "Precondition Failed");
    std::string head;
    std::string part;
    if (ranged) {
      if (first >= body.size()) return simple(416, "Range Not Satisfiable");
      last = std::min<std::uint64_t>(last, body.size() - 1);
      part = body.substr(first, last - first + 1);
      head = "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes " + std::to_string(first) + "-" +
             std::to_string(last) + "/" + std::to_string(body.size()) + "\r\n";
    } else {
      part = body;
      head = "HTTP/1.1 200 OK\r\n";
    }
    head += "ETag: " + etag + "\r\nContent-Length: " + std::to_string(part.size()) + "\r\n\r\n";
    if (!send_all(fd, head.data(), head.size())) return false;
    if (take(stall)) {
      while (!stopping_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return false;
    }
    if (take(cut_body_after_half)) {
      send_all(fd, part.data(), part.size() / 2);
      sent_.fetch_add(part.size() / 2);
      return false;
    }
    sent_.fetch_add(part.size());
    return send_all(fd, part.data(), part.size());
  }

  std::string path_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::string body_;                                             // guarded by mu_
  int version_ = 1;                                              // guarded by mu_
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges_;  // guarded by mu_
  std::vector<int> open_;                                        // guarded by mu_
  std::vector<std::thread> workers_;                             // guarded by mu_
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<int> connections_{0};
  std::atomic<int> requests_{0};
};

}  // namespace safetensors::test

#endif  // SAFETENSORS_TESTS_LOOPBACK_HTTP_H_
