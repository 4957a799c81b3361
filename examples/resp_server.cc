// A Redis-protocol (RESP2) server for PING, ECHO, SET, GET and DEL on
// libbufpool's public headers and liburing, for redis-cli and redis-benchmark
// (inline and multi-bulk requests, pipelined). Receives land in pool buffers
// lent to a ProvidedBufferRing and join each connection's input (Take(cqe,
// in)); ChainCursor parses multi-bulk requests across slices, LineSplitter
// inline ones; HeldSend sends replies, one send per connection per loop
// turn with every reply the turn produced. A large value (SET of 1 MiB) stays
// in the buffers it arrived in and is linked into replies, never copied; a
// partial command in many part-filled buffers is packed into full ones.
// Receives that run out of buffers are parked (ParkedReceives); while the
// ring cannot lend enough, the pool's notice, read in the same ring, wakes
// the loop as soon as a buffer is free.
// Each connection's input and replies are bound to its own budget
// (bufpool/budget.h), so one client cannot take the pool: receiving pauses
// while they pin kHighBytes and resumes at kLowBytes, and a command still
// unfinished when it pins more than kMaxQuery is answered "-ERR ... query
// buffer limit ..." and the connection closed, as Redis does past its
// client-query-buffer-limit. (A connection reserves nothing: a reservation
// would cost every idle connection a buffer, where an idle connection
// here pins none.)
// Built from an installed copy: c++ -std=c++20 resp_server.cc $(pkg-config
// --cflags --libs bufpool).
// SIGUSR1 prints the pool's counters on stdout (bench/run_resp_bench reads
// them): "stats: in_use=N cached=N high_water=N buffer_size=N conns=N".
//
//   resp_server [PORT [SECONDS]]  # PORT: 6379, 0 picks one; SECONDS 0: forever
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/cursor.h"
#include "bufpool/uring.h"

// Defined only when linked with bench/echo_alloc_counter.cc.
extern "C" uint64_t BufpoolEchoHeapAllocations() __attribute__((weak));

namespace {

using bufpool::BufferChain;
using bufpool::ChainCursor;
enum Op : uint64_t { kAccept = 1, kRecv = 2, kSend = 3, kNotify = 4 };
constexpr size_t kMaxBulk = 2 << 20, kLinkAbove = 16 << 10;  // see store
// Per connection, what its budget lets input and unsent replies pin (the
// pool is 64 MiB): an unfinished command at most kMaxQuery (room for a
// kMaxBulk value received in part-filled buffers, twice its bytes before
// it is packed); receiving pauses at kHighBytes and resumes at kLowBytes,
// which is kMaxQuery so that a connection whose replies have gone out is
// always below it; kMaxBytes leaves room for what arrives and what the
// commands received so far answer while the pause takes effect.
constexpr size_t kMaxQuery = 2 * kMaxBulk + (64 << 10);
constexpr size_t kLowBytes = kMaxQuery, kHighBytes = 6 << 20;
constexpr size_t kMaxBytes = 8 << 20;
struct Conn {
  explicit Conn(int f) : fd(f) {}
  int fd;
  // Charged by `in`, `out` and the send `out` moves into; declared first, so
  // that it outlives them.
  std::unique_ptr<bufpool::BufferBudget> budget;
  BufferChain in, out;
  bufpool::LineSplitter inline_lines{{.max_line = 64 << 10}};
  std::vector<std::string> args;         // of a command that crosses slices
  std::vector<absl::string_view> views;  // the arguments Execute() gets
  bufpool::HeldSend send;
  bool receiving = false, parked = false, done = false;
  bool send_queued = false;  // in `sending`: its replies go at the turn's end
  bool paused = false;       // over the budget's high watermark, not yet low
};
io_uring ring;
bufpool::BufferPool* pool;
std::unique_ptr<bufpool::ProvidedBufferRing> bufs;
std::unique_ptr<bufpool::ParkedReceives> parked;  // out of ring buffers
std::unordered_set<Conn*> live;
// Values: copied, or over kLinkAbove kept as slices (`second`, if not empty).
// Keys are found by the request's view of them, without a copy.
struct KeyHash {
  using is_transparent = void;
  size_t operator()(absl::string_view key) const {
    return std::hash<std::string_view>()({key.data(), key.size()});
  }
};
std::unordered_map<std::string, std::pair<std::string, BufferChain>, KeyHash,
                   std::equal_to<>>
    store;
size_t max_partial_buffers = 0;  // reported at exit
volatile sig_atomic_t time_is_up = 0;
volatile sig_atomic_t stats_wanted = 0;    // SIGUSR1: print the pool's Stats()
io_uring_sqe* Sqe(Conn* c, uint64_t op) {  // its completion: (c, op)
  io_uring_sqe* sqe;
  while ((sqe = io_uring_get_sqe(&ring)) == nullptr) io_uring_submit(&ring);
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(c) | op);
  return sqe;
}
void Receive(Conn* c) {
  bufs->PrepareRecv(Sqe(c, kRecv), c->fd);
  c->receiving = true;
}
void Send(Conn* c) {
  if (!c->send.busy() && !c->out.empty())
    c->send.Prepare(Sqe(c, kSend), c->fd, std::move(c->out));
}
// Replies wait for the end of the loop turn, so all a turn's completions of
// one connection go out in one send.
std::vector<Conn*> sending;
void QueueSend(Conn* c) {
  if (c->send_queued || c->send.busy() || c->out.empty()) return;
  c->send_queued = true;
  sending.push_back(c);
}
void MaybeClose(Conn* c) {
  if (!c->done || c->receiving || c->send.busy() || c->parked || c->send_queued)
    return;
  close(c->fd);
  live.erase(c);
  delete c;
}
void Reply(Conn* c, absl::string_view s) {  // the pool ran dry: give up
  if (!c->out.Append(s).ok()) c->done = true;
}
void Bulk(Conn* c, absl::string_view s) {  // the header in SSO: no allocation
  Reply(c, absl::StrCat("$", s.size(), "\r\n"));
  Reply(c, s);
  Reply(c, "\r\n");
}
void BulkChain(Conn* c, BufferChain&& chain) {
  Reply(c, absl::StrCat("$", chain.size(), "\r\n"));
  c->out.Append(std::move(chain));  // links the slices, no copy
  Reply(c, "\r\n");
}
void ProtocolError(Conn* c, const std::string& what) {
  Reply(c, "-ERR Protocol error: " + what + "\r\n");
  c->done = true;  // as Redis does: answer, then close
}
// Whether `cmd` is the command `name` (upper-case letters), in any case:
// clearing bit 5 upper-cases a letter and makes no other byte one.
bool Is(absl::string_view cmd, absl::string_view name) {
  if (cmd.size() != name.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if ((cmd[i] & ~0x20) != name[i]) return false;
  }
  return true;
}
// Runs args[0]; `big`: the last argument as slices, when too large to copy,
// or nullptr.
void Execute(Conn* c, absl::Span<const absl::string_view> args,
             BufferChain* big) {
  const absl::string_view cmd = args[0];
  const size_t n = args.size();
  if (Is(cmd, "GET") && n == 2) {
    auto it = store.find(args[1]);
    if (it == store.end()) return Reply(c, "$-1\r\n");
    if (it->second.second.empty()) return Bulk(c, it->second.first);
    BulkChain(c, it->second.second.Clone());
  } else if (Is(cmd, "SET") && n == 3) {
    auto it = store.find(args[1]);  // a new key allocates, an old one not
    if (it == store.end()) it = store.try_emplace(std::string(args[1])).first;
    auto& [copy, slices] = it->second;
    copy.assign(args[2].data(), args[2].size());
    // Into an unbound chain: the value outlives the connection, so its
    // buffers leave the connection's budget with it.
    if (!slices.empty()) slices.Clear();
    if (big != nullptr) slices.Append(std::move(*big));
    Reply(c, "+OK\r\n");
  } else if (Is(cmd, "PING") && n <= 2) {
    n == 1 ? Reply(c, "+PONG\r\n") : Bulk(c, args[1]);
  } else if (Is(cmd, "ECHO") && n == 2) {
    big == nullptr ? Bulk(c, args[1]) : BulkChain(c, std::move(*big));
  } else if (Is(cmd, "DEL") && n >= 2) {
    size_t gone = 0;
    for (size_t i = 1; i < n; ++i) {
      if (auto it = store.find(args[i]); it != store.end()) {
        store.erase(it);
        ++gone;
      }
    }
    Reply(c, absl::StrCat(":", gone, "\r\n"));
  } else {
    Reply(c, absl::StrCat(
                 "-ERR unknown command or wrong number of arguments for '",
                 args[0], "'\r\n"));
  }
}
// Parses one whole multi-bulk command at [p, end) into `args` (views of
// its bytes) and returns the byte after it; nullptr for anything else (a
// command that goes past `end`, is malformed or carries a large value).
const char* ParseInPlace(const char* p, const char* const end,
                         std::vector<absl::string_view>& args) {
  // "<prefix><digits>\r\n": its number (at most 18 digits), or -1.
  auto number = [&](char prefix) -> long long {
    if (p == end || *p != prefix) return -1;
    const char* const digits = ++p;
    uint64_t v = 0;  // wraps past 19 digits, refused below
    while (p != end && static_cast<unsigned char>(*p - '0') < 10) {
      v = v * 10 + static_cast<unsigned>(*p++ - '0');
    }
    if (p == digits || p - digits > 18 || end - p < 2 || p[0] != '\r' ||
        p[1] != '\n') {
      return -1;
    }
    p += 2;
    return static_cast<long long>(v);
  };
  const long long n = number('*');
  if (n < 1) return nullptr;
  args.clear();
  for (long long i = 0; i < n; ++i) {
    const long long len = number('$');
    if (len < 0 || static_cast<size_t>(len) > kLinkAbove || end - p < len + 2 ||
        p[len] != '\r' || p[len + 1] != '\n') {
      return nullptr;
    }
    args.emplace_back(p, static_cast<size_t>(len));
    p += len + 2;
  }
  return p;
}
// The common case: whole multi-bulk commands inside the input's first
// slice, each parsed and run where it lies (its arguments views of the
// slice), then consumed together. Returns false, having done nothing, when
// the first is anything else (it crosses slices, is incomplete, malformed
// or carries a large value), which MultiBulk() then handles.
bool MultiBulkInSlice(Conn* c) {
  const bufpool::SharedBuffer& front = c->in.slice(0);
  const char* const begin = reinterpret_cast<const char*>(front.data());
  const char* const end = begin + front.size();
  const char* done = begin;  // past the commands run
  while (!c->done) {
    const char* next = ParseInPlace(done, end, c->views);
    if (next == nullptr) break;
    Execute(c, c->views, nullptr);
    done = next;
  }
  c->in.Consume(static_cast<size_t>(done - begin));
  return done != begin;
}
// Reads a "<prefix><digits>\r\n" line: its number; -1 incomplete; -2 bad.
long long ReadNumberLine(ChainCursor& cur, char prefix) {
  std::optional<size_t> end = cur.Find("\r\n", 24);
  if (!end) return cur.remaining() >= 24 ? -2 : -1;
  char line[24];
  cur.Read(absl::MakeSpan(reinterpret_cast<std::byte*>(line), *end + 2));
  long long v;
  if (line[0] != prefix || !absl::SimpleAtoi({line + 1, *end - 1}, &v))
    return -2;
  return v < 0 ? -2 : v;
}
// Runs a whole "*N\r\n" + N x "$len\r\n<bytes>\r\n" command, if it is here.
bool MultiBulk(Conn* c) {
  ChainCursor cur(c->in);
  const long long n = ReadNumberLine(cur, '*');
  if (n == -1) return false;
  if (n < 1) return ProtocolError(c, "invalid multibulk length"), false;
  std::vector<std::string>& args = c->args;  // reused: no allocation
  size_t big_at = 0, big_len = 0;            // a last argument kept as slices
  for (long long i = 0; i < n; ++i) {
    const long long len = ReadNumberLine(cur, '$');
    if (len == -1) return false;
    if (len < 0 || static_cast<size_t>(len) > kMaxBulk)
      return ProtocolError(c, "invalid bulk length"), false;
    if (cur.remaining() < static_cast<size_t>(len) + 2) return false;
    if (args.size() <= static_cast<size_t>(i)) args.emplace_back();
    args[i].resize(i == n - 1 && static_cast<size_t>(len) > kLinkAbove ? 0
                                                                       : len);
    if (args[i].size() != static_cast<size_t>(len)) {
      big_at = cur.position(), big_len = len;
      cur.Skip(len);
    } else {
      cur.Read(
          absl::MakeSpan(reinterpret_cast<std::byte*>(args[i].data()), len));
    }
    if (cur.ReadBE<uint16_t>() != uint16_t{'\r' << 8 | '\n'})
      return ProtocolError(c, "expected CRLF after a bulk string"), false;
  }
  args.resize(n);  // drops what a longer command left
  BufferChain big;
  c->in.Consume(big_len != 0 ? big_at : cur.position());
  if (big_len != 0) big = c->in.Split(big_len), c->in.Consume(2);
  c->views.assign(args.begin(), args.end());  // reused: no allocation
  Execute(c, c->views, big_len != 0 ? &big : nullptr);
  return true;
}
void Process(Conn* c) {  // runs every complete command in c->in
  while (!c->in.empty() && !c->done) {
    if (c->in.slice(0).data()[0] == std::byte{'*'}) {
      if (!MultiBulkInSlice(c) && !MultiBulk(c)) break;
      continue;
    }
    // The line's view stays valid until the next NextView().
    auto line = c->inline_lines.NextView(c->in);
    if (!line.ok()) ProtocolError(c, "too big inline request");
    if (!line.ok() || !line->has_value()) break;
    std::vector<absl::string_view>& args = c->views;  // reused: no allocation
    args.clear();
    for (absl::string_view word :
         absl::StrSplit(**line, ' ', absl::SkipEmpty())) {
      args.push_back(word);
    }
    if (!args.empty()) Execute(c, args, nullptr);
  }
  const size_t bs = pool->buffer_size();
  if (!c->done && c->in.slice_count() * bs > 2 * c->in.size() + 2 * bs) {
    BufferChain packed(*c->budget);  // a partial command: into full buffers
    bool ok = true;
    for (auto part : c->in.spans()) ok = ok && packed.Append(part).ok();
    if (ok) c->in = std::move(packed);  // same bytes: splitter state holds
  }
  max_partial_buffers = std::max(max_partial_buffers, c->in.slice_count());
  // An unfinished command past the query limit (the budget's count first:
  // pinned_bytes() walks the slices).
  if (!c->done && c->budget->pinned_bytes() > kMaxQuery &&
      c->in.pinned_bytes() > kMaxQuery) {
    ProtocolError(c, absl::StrCat("query buffer limit of ", kMaxQuery,
                                  " bytes reached by an unfinished command"));
  }
  if (c->done) {  // stop receiving; what was answered is still sent
    c->in.Clear();
    io_uring_prep_cancel64(Sqe(nullptr, 0),
                           reinterpret_cast<uint64_t>(c) | kRecv, 0);
  }
  QueueSend(c);
}
// SIGUSR1's line (bench/run_resp_bench reads it).
void PrintStats() {
  const bufpool::PoolStats st = pool->Stats();
  std::printf(
      "stats: in_use=%zu cached=%zu high_water=%zu "
      "buffer_size=%zu conns=%zu",
      st.in_use, st.cached, st.high_water, pool->buffer_size(), live.size());
  // Built with bench/echo_alloc_counter.cc (resp_server-counting): the
  // process's heap allocations so far.
  if (BufpoolEchoHeapAllocations != nullptr) {
    std::printf(" heap_allocations=%llu",
                static_cast<unsigned long long>(BufpoolEchoHeapAllocations()));
  }
  std::printf("\n");
  std::fflush(stdout);
}
int Fail(const absl::Status& s) {
  return std::fprintf(stderr, "resp_server: %s\n", s.ToString().c_str()), 1;
}
// A listening socket on 127.0.0.1:port (0 picks one), or -1.
int Listen(int port) {
  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{.sin_family = AF_INET,
                 .sin_port = htons(static_cast<uint16_t>(port)),
                 .sin_addr = {htonl(INADDR_LOOPBACK)},
                 .sin_zero = {}};
  socklen_t len = sizeof(sa);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      listen(lfd, 512) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    return std::perror("resp_server: listen"), -1;
  std::printf("listening on 127.0.0.1:%d\n", ntohs(sa.sin_port));
  std::fflush(stdout);
  return lfd;
}
void Accept(int lfd) {
  io_uring_prep_multishot_accept(Sqe(nullptr, kAccept), lfd, 0, 0, 0);
}
// A connection with its budget; nullptr (the socket closed) when the budget
// cannot be made.
Conn* NewConn(int fd) {
  auto* c = new Conn(fd);
  auto budget = pool->CreateBudget({.name = absl::StrCat("conn ", fd),
                                    .max_bytes = kMaxBytes,
                                    .high_watermark = kHighBytes,
                                    .low_watermark = kLowBytes,
                                    // Acted on in OnCompletion.
                                    .on_high = [c] { c->paused = true; },
                                    .on_low = [c] { c->paused = false; }});
  if (!budget.ok()) {
    std::fprintf(stderr, "resp_server: %s\n",
                 budget.status().ToString().c_str());
    close(fd);
    delete c;
    return nullptr;
  }
  c->budget = *std::move(budget);
  c->in = BufferChain(*c->budget);
  c->out = BufferChain(*c->budget);
  return c;
}
// One completion.
void OnCompletion(const io_uring_cqe& cqe, int lfd, bool stopping) {
  auto* c = reinterpret_cast<Conn*>(cqe.user_data & ~uint64_t{7});
  const bool more = cqe.flags & IORING_CQE_F_MORE;
  switch (cqe.user_data & 7) {
    case 0:  // a cancel's own completion
      return;
    case kNotify:  // a buffer is free: the next Refill() lends it
      parked->OnNotice();
      return;
    case kAccept:
      if (cqe.res >= 0) {
        const int one = 1;
        setsockopt(cqe.res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (Conn* nc = NewConn(cqe.res); nc != nullptr) {
          Receive(*live.insert(nc).first);
          if (stopping) shutdown(cqe.res, SHUT_RDWR);
        }
      }
      if (!more && !stopping) Accept(lfd);
      return;
    case kRecv: {
      if (!more) c->receiving = false;
      // Charged to the connection's budget. A ResourceExhausted that carries
      // bytes (res > 0) is the budget's: they are in `in` all the same.
      absl::Status s = bufs->Take(cqe, c->in);  // gives back its buffers
      if (c->done) {
        c->in.Clear();  // closing: what still arrives is dropped
      } else if (cqe.res > 0 && (s.ok() || absl::IsResourceExhausted(s))) {
        Process(c);
      } else if (cqe.res == -ENOBUFS) {  // the ring was empty: wait
        if (!more) c->parked = true, parked->Park(c);
      } else if (cqe.res != -ECANCELED || stopping) {
        c->done = true;  // end of stream or an error
      }
      if (c->paused && more && !c->done) {  // stop the multishot receive
        io_uring_prep_cancel64(Sqe(nullptr, 0),
                               reinterpret_cast<uint64_t>(c) | kRecv, 0);
      }
      if (!more && !c->done && !c->parked && !c->paused) Receive(c);
      break;
    }
    case kSend: {
      if (!c->send.OnCompletion(cqe)) return;
      c->send.ReturnUnsentTo(c->out);  // resumed, then the rest
      if (c->send.result() < 0) c->done = true, c->out.Clear();
      QueueSend(c);
      // Sent down to the low watermark: receive again.
      if (!c->paused && !c->receiving && !c->parked && !c->done && !stopping)
        Receive(c);
      break;
    }
  }
  MaybeClose(c);
}

}  // namespace

int main(int argc, char** argv) {
  const int port = argc > 1 ? std::atoi(argv[1]) : 6379;
  const int seconds = argc > 2 ? std::atoi(argv[2]) : 0;
  // Only a flag here; the loop prints (the 100 ms tick wakes it). Set before
  // "listening on" is printed, so whoever reads that may signal at once.
  signal(SIGUSR1, [](int) { stats_wanted = 1; });
  auto created_pool = bufpool::BufferPool::Create({.buffer_count = 16384});
  if (!created_pool.ok()) return Fail(created_pool.status());
  pool = created_pool->get();
  const int lfd = Listen(port);
  if (lfd < 0) return 1;
  // One thread drives the ring: task work runs when it waits, not by IPI.
  absl::StatusOr<bufpool::ServerRingSetup> setup =
      bufpool::InitServerRing(&ring, {.entries = 512});
  if (!setup.ok()) return Fail(setup.status());
  auto created = bufpool::ProvidedBufferRing::Create(
      &ring, *pool, {.group_id = 1, .max_buffers = 2048});
  if (!created.ok()) return Fail(created.status());
  bufs = *std::move(created);
  auto created_parked = bufpool::ParkedReceives::Create(*bufs);
  if (!created_parked.ok()) return Fail(created_parked.status());
  parked = *std::move(created_parked);
  Accept(lfd);
  bool stopping = false;
  signal(SIGALRM, [](int) { time_is_up = 1; });
  alarm(seconds);  // 0: never
  while (!stopping || !live.empty()) {
    if (!stopping && time_is_up) {
      stopping = true;
      close(lfd);
      for (Conn* c : live) shutdown(c->fd, SHUT_RDWR);
    }
    if (stats_wanted) stats_wanted = 0, PrintStats();
    bufs->Refill();
    // Parked receives re-armed once the ring can lend again; while some
    // stay parked, the pool's notice is read in the ring.
    auto rearm = [stopping](void* who) {
      Conn* c = static_cast<Conn*>(who);
      c->parked = false;
      stopping ? (c->done = true, MaybeClose(c)) : Receive(c);
    };
    if (stopping) parked->RearmAll(rearm);
    parked->Rearm(&ring, kNotify, rearm);
    // The tick is for the deadline only; buffers come by the notice.
    __kernel_timespec tick{0, 100 * 1000 * 1000};
    io_uring_cqe* cqe;
    io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &tick, nullptr);
    unsigned head, n = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++n;
      OnCompletion(*cqe, lfd, stopping);
    }
    io_uring_cq_advance(&ring, n);
    // One send per connection per turn, of every reply the turn produced.
    for (Conn* c : sending) {
      c->send_queued = false;
      Send(c);
      MaybeClose(c);
    }
    sending.clear();  // keeps its capacity
  }
  store.clear(), bufs.reset();  // every buffer back, before the ring goes
  io_uring_queue_exit(&ring);   // no read of the notice in flight after this
  parked.reset();
  std::printf("done: %zu buffers in use; a partial command held at most %zu\n",
              pool->Stats().in_use, max_partial_buffers);
  return 0;
}
