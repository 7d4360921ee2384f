// tvm_rpc: a TVM RPC server on TVM's runtime library only, the farm's native phone.
//
//   tvm_rpc --tracker HOST:PORT --key KEY [--host 127.0.0.1] [--port 9090] [--port-end 9199]
//           [--custom-addr ADDR] [--work-dir DIR] [--handshake-timeout-s 10]
//           [--session-cap-s 600]
//
// What a phone runs: no compiler, no linker, no Python. It registers at a TVM RPC tracker
// under KEY (TVM's tracker protocol, as tvm.rpc.server speaks it), accepts a session at a
// time, forks a process per session (a crashing kernel ends its session, not the phone) and
// serves it with the runtime's own RPC loop (`rpc.ServerLoop`) in a fresh work folder.
// It adds the two functions a session needs that TVM's runtime library leaves to its host
// program: `tvm.rpc.server.workpath` (where uploads land) and `tvm.rpc.server.load_module`
// (a shared library linked on the worker host, loaded as it is).
//
// Its limits, since one phone serves everybody one session at a time: a client has
// --handshake-timeout-s to send its handshake (one that connects and says nothing is dropped,
// not waited on for good); a session lasts what its client asked for and at most
// --session-cap-s (0: no cap); the tracker link and every session's connection have TCP
// keepalive (a peer that vanished is noticed in about a minute); and every file name a client
// gives (workpath, hence upload, download and remove; load_module) is a plain name in the
// session's folder ("": the folder): one with a '/' (absolute or not) or that is "." or ".."
// is refused with an error saying so. Built by the farm for
// aarch64 (farm/devices/arm64sim.py) and linked against the pinned TVM wheel's own
// libtvm_runtime.so and libtvm_ffi.so: the pair a user pushes to a Linux board with adb.
// TVM's apps/cpp_rpc is the same shape, with Android and Windows parts this one leaves out.

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

namespace {

constexpr int32_t kRPCMagic = 0xff271;
constexpr int32_t kTrackerMagic = 0x2f271;
constexpr int32_t kCodeSuccess = kRPCMagic;
constexpr int32_t kCodeMismatch = kRPCMagic + 2;
constexpr int kPut = 3, kUpdateInfo = 5, kGetPendingMatchkeys = 7;
// TCP keepalive: probes after 30 s of silence, every 10 s, 3 unanswered: the peer is gone
constexpr int kKeepIdleS = 30, kKeepIntervalS = 10, kKeepCount = 3;
constexpr int kTrackerReplyS = 30;  // a tracker that does not answer a request within it: lost

using Clock = std::chrono::steady_clock;
constexpr Clock::time_point kNever = Clock::time_point::max();

std::string g_workdir;  // the session's folder (set in the session's process)

void Log(const std::string& msg) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::fprintf(stderr, "%s tvm_rpc[%d]: %s\n", stamp, static_cast<int>(getpid()), msg.c_str());
  std::fflush(stderr);
}

// Wait until `fd` is ready for `events`; false once `deadline` has passed (kNever: no wait).
bool Ready(int fd, short events, Clock::time_point deadline) {
  if (deadline == kNever) return true;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    int got = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), INT_MAX)));
    if (got > 0) return true;
    if (got < 0 && errno != EINTR) return false;
  }
}

// The whole of `data`, by `deadline` (the whole exchange, not each piece: a peer sending a
// byte at a time cannot stretch it).
bool SendAll(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!Ready(fd, POLLOUT, deadline)) return false;
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!Ready(fd, POLLIN, deadline)) return false;
    ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// little endian, as TVM's
bool SendInt(int fd, int32_t v, Clock::time_point deadline) {
  return SendAll(fd, &v, 4, deadline);
}
bool RecvInt(int fd, int32_t* v, Clock::time_point deadline) {
  return RecvAll(fd, v, 4, deadline);
}

bool SendStr(int fd, const std::string& s, Clock::time_point deadline) {
  return SendInt(fd, static_cast<int32_t>(s.size()), deadline) &&
         SendAll(fd, s.data(), s.size(), deadline);
}

bool RecvStr(int fd, std::string* s, Clock::time_point deadline, int32_t limit = 1 << 20) {
  int32_t n = 0;
  if (!RecvInt(fd, &n, deadline) || n < 0 || n > limit) return false;
  s->assign(static_cast<size_t>(n), '\0');
  return RecvAll(fd, s->data(), static_cast<size_t>(n), deadline);
}

// TCP keepalive on a connection: a peer whose host died or left the network is noticed
// (a blocked read fails) instead of held for good.
void KeepAlive(int fd) {
  int on = 1, idle = kKeepIdleS, interval = kKeepIntervalS, count = kKeepCount;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) != 0) {
    Log(std::string("cannot set TCP keepalive: ") + std::strerror(errno));
  }
}

std::string Quote(const std::string& s) {  // a JSON string (keys and addresses: no escapes)
  return "\"" + s + "\"";
}

int Connect(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

// The listening socket on the first free port of [port, port_end).
int Listen(const std::string& host, int port, int port_end, int* bound) {
  for (int p = port; p < port_end; ++p) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host.c_str(), std::to_string(p).c_str(), &hints, &res) != 0) return -1;
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    bool ok = fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 8) == 0;
    freeaddrinfo(res);
    if (ok) {
      *bound = p;
      return fd;
    }
    if (fd >= 0) close(fd);
  }
  return -1;
}

struct Options {
  std::string tracker_host;
  int tracker_port = 0;
  std::string key;
  std::string host = "127.0.0.1";
  int port = 9090;
  int port_end = 9199;
  std::string custom_addr;
  std::string work_dir = "/tmp";
  int handshake_timeout_s = 10;  // a client's handshake, from its connection
  int session_cap_s = 600;       // the longest session, whatever its client asked (0: no cap)
};

// The tracker link: register, keep the registration fresh, register again after a session.
class Tracker {
 public:
  Tracker(const Options& opt, int port) : opt_(opt), port_(port), rng_(std::random_device{}()) {}

  // (Re)connect and put this phone under its key with a new match key; false on failure.
  bool Register() {
    if (fd_ < 0 && !Open()) return false;
    std::uniform_real_distribution<double> u(0.0, 1.0);
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.15f", u(rng_));
    matchkey_ = opt_.key + ":" + buf;
    std::string addr = opt_.custom_addr.empty() ? "null" : Quote(opt_.custom_addr);
    std::string msg = "[" + std::to_string(kPut) + ", " + Quote(opt_.key) + ", [" +
                      std::to_string(port_) + ", " + Quote(matchkey_) + "], " + addr + "]";
    std::string reply;
    if (!SendStr(fd_, msg, Reply()) || !RecvStr(fd_, &reply, Reply()) || reply != "0") {
      return Drop();
    }
    unmatched_ = 0;
    return true;
  }

  // Every ping period with no session: is our match key still pending at the tracker? A key
  // handed to a client that never came is replaced (as TVM's server does).
  bool Ping() {
    if (fd_ < 0) return Register();
    std::string reply;
    if (!SendStr(fd_, "[" + std::to_string(kGetPendingMatchkeys) + "]", Reply()) ||
        !RecvStr(fd_, &reply, Reply())) {
      return Drop();
    }
    if (reply.find(Quote(matchkey_)) == std::string::npos) {
      if (++unmatched_ * kPingS > kUnmatchedS + kPingS) return Register();
    } else {
      unmatched_ = 0;
    }
    return true;
  }

  const std::string& matchkey() const { return matchkey_; }
  int fd() const { return fd_; }
  static constexpr int kPingS = 2;

 private:
  static constexpr int kUnmatchedS = 4;

  static Clock::time_point Reply() { return Clock::now() + std::chrono::seconds(kTrackerReplyS); }

  bool Open() {
    fd_ = Connect(opt_.tracker_host, opt_.tracker_port);
    if (fd_ < 0) return false;
    KeepAlive(fd_);
    int32_t magic = 0;
    if (!SendInt(fd_, kTrackerMagic, Reply()) || !RecvInt(fd_, &magic, Reply()) ||
        magic != kTrackerMagic) {
      return Drop();
    }
    std::string addr = opt_.custom_addr.empty() ? "null" : Quote(opt_.custom_addr);
    std::string info = "[" + std::to_string(kUpdateInfo) + ", {\"key\": " +
                       Quote("server:" + opt_.key) + ", \"addr\": [" + addr + ", " +
                       std::to_string(port_) + "]}]";
    std::string reply;
    if (!SendStr(fd_, info, Reply()) || !RecvStr(fd_, &reply, Reply()) || reply != "0") {
      return Drop();
    }
    return true;
  }

  bool Drop() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return false;
  }

  const Options& opt_;
  int port_;
  int fd_ = -1;
  int unmatched_ = 0;
  std::string matchkey_;
  std::mt19937_64 rng_;
};

// A client's handshake, all of it within the handshake timeout; returns the session timeout
// it asked for (0: none), -1 to refuse.
int Handshake(int conn, const Tracker& tracker, const Options& opt, const std::string& peer) {
  auto deadline = Clock::now() + std::chrono::seconds(opt.handshake_timeout_s);
  int32_t magic = 0;
  std::string header;
  if (!RecvInt(conn, &magic, deadline) || magic != kRPCMagic ||
      !RecvStr(conn, &header, deadline, 4096)) {
    if (Clock::now() >= deadline) {
      Log("a client at " + peer + " sent no handshake within " +
          std::to_string(opt.handshake_timeout_s) + " s: dropped");
    }
    return -1;
  }
  std::vector<std::string> words;
  size_t start = 0;
  while (start < header.size()) {
    size_t end = header.find(' ', start);
    if (end == std::string::npos) end = header.size();
    if (end > start) words.push_back(header.substr(start, end - start));
    start = end + 1;
  }
  if (words.empty() || words[0] != "client:" + tracker.matchkey()) {
    SendInt(conn, kCodeMismatch, deadline);
    Log("a client at " + peer + " with a wrong match key: refused");
    return -1;
  }
  std::string server_key = "server:" + opt.key;
  if (!SendInt(conn, kCodeSuccess, deadline) || !SendStr(conn, server_key, deadline)) return -1;
  int timeout_s = 0;
  for (size_t i = 1; i < words.size(); ++i) {
    if (words[i].rfind("-timeout=", 0) == 0) timeout_s = std::atoi(words[i].c_str() + 9);
  }
  return timeout_s;
}

void RemoveTree(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir != nullptr) {
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string child = path + "/" + name;
      struct stat st {};
      if (lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        RemoveTree(child);
      } else {
        unlink(child.c_str());
      }
    }
    closedir(dir);
  }
  rmdir(path.c_str());
}

// A client's file name as a path in the session's folder: a plain name only, or "" for the
// folder itself (MetaSchedule's default_cleanup ends with remove("")). The runtime's upload,
// download and remove map their names through workpath, so this is every place.
std::string SessionPath(const std::string& name) {
  if (name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    Log("refused the file name \"" + name + "\"");
    TVM_FFI_THROW(ValueError) << "tvm_rpc refused the file name \"" << name
                              << "\": a session's files are plain names in its work folder "
                                 "(no '/', not \".\" or \"..\")";
  }
  return g_workdir + "/" + name;
}

void RegisterSessionFunctions() {
  namespace ffi = tvm::ffi;
  ffi::Function::SetGlobal(
      "tvm.rpc.server.workpath",
      ffi::Function::FromTyped([](ffi::String name) -> ffi::String {
        return ffi::String(SessionPath(std::string(name)));
      }),
      true);
  ffi::Function::SetGlobal(
      "tvm.rpc.server.load_module",
      ffi::Function::FromTyped([](ffi::String name) -> ffi::Module {
        std::string path = SessionPath(std::string(name));
        Log("load_module " + path);
        return ffi::Module::LoadFromFile(ffi::String(path));
      }),
      true);
}

// One session in a process of its own; the phone goes on whatever the session does. It ends
// after `asked_s` (its client's timeout; 0: none) or the phone's cap, the sooner.
void Serve(int conn, int asked_s, const Options& opt, const std::string& peer,
           const std::vector<int>& inherited) {
  int cap_s = opt.session_cap_s;
  bool capped = cap_s > 0 && (asked_s <= 0 || asked_s > cap_s);
  int timeout_s = capped ? cap_s : asked_s;
  std::string tmpl = opt.work_dir + "/tvm_rpc-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    Log("cannot make a work folder in " + opt.work_dir + ": " + std::strerror(errno));
    return;
  }
  std::string workdir = buf.data();
  Log("session of " + peer + " in " + workdir);
  pid_t child = fork();
  if (child < 0) {
    Log(std::string("cannot fork a session: ") + std::strerror(errno));
    close(conn);
    RemoveTree(workdir);
    return;
  }
  if (child == 0) {
    for (int fd : inherited) close(fd);  // the session holds its connection only
    g_workdir = workdir;
    if (chdir(workdir.c_str()) != 0) _exit(3);
    try {
      tvm::ffi::Function::GetGlobalRequired("rpc.ServerLoop")(static_cast<int64_t>(conn));
    } catch (const std::exception& e) {
      Log(std::string("session ended with an error: ") + e.what());
      _exit(2);
    }
    _exit(0);
  }
  int status = 0;
  bool done = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (!done) {
    pid_t got = waitpid(child, &status, timeout_s > 0 ? WNOHANG : 0);
    if (got == child) {
      done = true;
    } else if (got < 0) {
      break;
    } else if (std::chrono::steady_clock::now() > deadline) {
      std::string limit = capped ? "the phone's session cap of " + std::to_string(cap_s) +
                                       " s (tvm_rpc --session-cap-s)"
                                 : "its " + std::to_string(timeout_s) + " s";
      Log("session of " + peer + " ran past " + limit + ": killed");
      auto ret = tvm::ffi::Function::GetGlobal("rpc.ReturnException");
      if (ret.has_value()) {
        std::string hint = capped ? "the phone's cap (tvm_rpc --session-cap-s) is reached"
                                  : "try to increase the \"session_timeout\" value";
        (*ret)(static_cast<int64_t>(conn),
               tvm::ffi::String("RPCSessionTimeoutError: Your " + std::to_string(timeout_s) +
                                "s session has expired, " + hint + "."));
      }
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      done = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL) {
    Log("session of " + peer + " crashed (signal " + std::to_string(WTERMSIG(status)) +
        "), serving on");
  }
  close(conn);
  RemoveTree(workdir);
}

bool ParseArgs(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--tracker" && value(&v)) {
      size_t colon = v.rfind(':');
      if (colon == std::string::npos) return false;
      opt->tracker_host = v.substr(0, colon);
      if (!opt->tracker_host.empty() && opt->tracker_host.front() == '[') {
        opt->tracker_host = opt->tracker_host.substr(1, opt->tracker_host.size() - 2);
      }
      opt->tracker_port = std::atoi(v.c_str() + colon + 1);
    } else if (a == "--key" && value(&v)) {
      opt->key = v;
    } else if (a == "--host" && value(&v)) {
      opt->host = v;
    } else if (a == "--port" && value(&v)) {
      opt->port = std::atoi(v.c_str());
    } else if (a == "--port-end" && value(&v)) {
      opt->port_end = std::atoi(v.c_str());
    } else if (a == "--custom-addr" && value(&v)) {
      opt->custom_addr = v;
    } else if (a == "--work-dir" && value(&v)) {
      opt->work_dir = v;
    } else if (a == "--handshake-timeout-s" && value(&v)) {
      opt->handshake_timeout_s = std::atoi(v.c_str());
    } else if (a == "--session-cap-s" && value(&v)) {
      opt->session_cap_s = std::atoi(v.c_str());
    } else {
      return false;
    }
  }
  return !opt->key.empty() && opt->tracker_port > 0 && opt->port_end > opt->port &&
         opt->handshake_timeout_s > 0 && opt->session_cap_s >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!ParseArgs(argc, argv, &opt)) {
    std::fprintf(stderr,
                 "usage: tvm_rpc --tracker HOST:PORT --key KEY [--host H] [--port P] "
                 "[--port-end E] [--custom-addr ADDR] [--work-dir DIR]\n"
                 "               [--handshake-timeout-s S (> 0, default 10)]\n"
                 "               [--session-cap-s S (0: none, default 600)]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  RegisterSessionFunctions();
  int port = 0;
  int listener = Listen(opt.host, opt.port, opt.port_end, &port);
  if (listener < 0) {
    Log("no free port in [" + std::to_string(opt.port) + ", " + std::to_string(opt.port_end) +
        ") on " + opt.host);
    return 1;
  }
  Log("listening on " + opt.host + ":" + std::to_string(port) + ", key " + opt.key +
      ", tracker " + opt.tracker_host + ":" + std::to_string(opt.tracker_port) +
      ", handshake timeout " + std::to_string(opt.handshake_timeout_s) + " s, session cap " +
      (opt.session_cap_s > 0 ? std::to_string(opt.session_cap_s) + " s" : "none"));
  Tracker tracker(opt, port);
  while (true) {
    if (!tracker.Register()) {  // the tracker is not there (yet, or any more): try again
      std::this_thread::sleep_for(std::chrono::seconds(1));
      continue;
    }
    int conn = -1;
    std::string peer;
    while (conn < 0) {
      pollfd p{listener, POLLIN, 0};
      int ready = poll(&p, 1, Tracker::kPingS * 1000);
      if (ready <= 0) {
        if (!tracker.Ping()) std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      sockaddr_storage from{};
      socklen_t len = sizeof(from);
      conn = accept(listener, reinterpret_cast<sockaddr*>(&from), &len);
      if (conn < 0) continue;
      char host[NI_MAXHOST] = "?";
      getnameinfo(reinterpret_cast<sockaddr*>(&from), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST);
      peer = host;
      KeepAlive(conn);
      int timeout_s = Handshake(conn, tracker, opt, peer);
      if (timeout_s < 0) {
        close(conn);
        conn = -1;
        continue;
      }
      Serve(conn, timeout_s, opt, peer, {listener, tracker.fd()});
    }
  }
}
