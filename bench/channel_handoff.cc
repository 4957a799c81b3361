// Hand-off of a 4 KiB buffer between two processes: BufferChannel (a token
// through shared memory, the receiver busy polling) against the same 4 KiB
// written to and read from a Unix socket pair (blocking), both ping-pong.
//
//   channel_handoff [--rounds N] [--iters N] [--cpus A,B]
//
// The parent makes a shared pool (PoolOptions::shared), two channels (one
// each way) and a socket pair, forks a child that joins the pool and the
// channels, and pins itself to CPU A and the child to CPU B
// (sched_setaffinity; default the first two CPUs it may run on). Each round
// runs every contender, `--iters` round trips each after a warm-up, the
// order rotating from round to round:
//
//   channel   the parent writes the round trip's number into the buffer's
//             first word and Send()s it; the child TryReceive()s in a busy
//             loop, checks the word, writes it + 1 and sends the same
//             buffer back; the parent busy polls for it and checks.
//   ring      the floor under the channel: the same ping-pong of 8-byte
//             tokens through the same kind of ring (src/pool/token_ring.h)
//             with no pool behind it (no Export/Import, no buffer touched):
//             what the ownership ledger adds is channel - ring.
//   line      the floor of any hand-off between the two CPUs: the same
//             ping-pong on one 8-byte word in shared memory (one cache
//             line each way). On a VM it moves with where the host places
//             the two vCPUs; channel / line says how far above the floor
//             the channel is, whatever the machine.
//   socket    the parent write()s 4 KiB (the number in its first word); the
//             child read()s all 4 KiB, checks, and writes 4 KiB back; the
//             parent reads them and checks. Blocking descriptors, as a
//             server uses them.
//
// Times are of whole round trips (steady_clock around each); one-way is
// half a round trip. Prints one JSON line per round:
//   {"contender": "channel_handoff", "channel_oneway_p50_ns": ...,
//    "channel_oneway_p99_ns": ..., "socket_oneway_p50_ns": ...,
//    "ring_oneway_p50_ns": ..., "ring_oneway_p99_ns": ...,
//    "line_oneway_p50_ns": ..., "channel_vs_line_p50": ...,
//    "socket_oneway_p99_ns": ..., "socket_vs_channel_p50": ...}
// and a summary on stderr. tools/bench runs it; tools/bench_report.py turns
// the lines into goal rows.
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "bufpool/channel.h"
#include "pool/token_ring.h"

namespace {

using bufpool::Buffer;
using bufpool::BufferChannel;
using bufpool::BufferPool;

constexpr size_t kBytes = 4096;
constexpr int kWarmup = 2000;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "channel_handoff: %s\n", what.c_str());
  std::exit(1);
}

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    Die("sched_setaffinity to CPU " + std::to_string(cpu) + ": " +
        std::strerror(errno));
  }
}

bool WriteAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

uint64_t& Word(const Buffer& b) {
  return *reinterpret_cast<uint64_t*>(b.data());
}

Buffer Spin(BufferChannel& ch) {
  for (;;) {
    if (Buffer b = ch.TryReceive()) return b;
  }
}

// The child's side of one contender's round trips.
void ChildChannel(BufferChannel& in, BufferChannel& out, int n) {
  for (int i = 0; i < n; ++i) {
    Buffer b = Spin(in);
    if (Word(b) != static_cast<uint64_t>(i)) Die("channel: wrong buffer");
    Word(b) = i + 1;
    if (!out.Send(std::move(b)).ok()) Die("channel: child's send failed");
  }
}

void ChildRing(bufpool::internal::TokenRing& in,
               bufpool::internal::TokenRing& out, int n) {
  for (int i = 0; i < n; ++i) {
    uint64_t token;
    while (!in.Front(&token)) {
    }
    in.Pop();
    if (token != static_cast<uint64_t>(i)) Die("ring: wrong token");
    while (!out.HasRoom()) {
    }
    out.Push(token + 1);
  }
}

// The one-line floor: the parent stores i in `ping`, the child answers in
// `pong` (its own line).
struct alignas(128) Line {
  std::atomic<uint64_t> word{0};
};

// Run `run` uses the values run * n + 1 .. (run + 1) * n, so no side
// ever resets a word the other may still be waiting to see.
void ChildLine(Line* ping, Line* pong, int n, int run) {
  const uint64_t base = static_cast<uint64_t>(run) * n;
  for (uint64_t i = base + 1; i <= base + n; ++i) {
    while (ping->word.load(std::memory_order_acquire) != i) {
    }
    pong->word.store(i, std::memory_order_release);
  }
}

void ChildSocket(int fd, int n) {
  alignas(64) static char buf[kBytes];
  for (int i = 0; i < n; ++i) {
    if (!ReadAll(fd, buf, kBytes)) Die("socket: child's read failed");
    uint64_t w;
    std::memcpy(&w, buf, sizeof(w));
    if (w != static_cast<uint64_t>(i)) Die("socket: wrong bytes");
    ++w;
    std::memcpy(buf, &w, sizeof(w));
    if (!WriteAll(fd, buf, kBytes)) Die("socket: child's write failed");
  }
}

using Clock = std::chrono::steady_clock;

// Round-trip times in ns, the warm-up's left out.
std::vector<double> ParentChannel(BufferPool& pool, BufferChannel& out,
                                  BufferChannel& in, int n) {
  std::vector<double> rtt;
  rtt.reserve(n);
  Buffer b = pool.TryAcquire();
  if (!b) Die("channel: no buffer");
  for (int i = 0; i < n; ++i) {
    Word(b) = i;
    const Clock::time_point t0 = Clock::now();
    if (!out.Send(std::move(b)).ok()) Die("channel: parent's send failed");
    b = Spin(in);
    const Clock::time_point t1 = Clock::now();
    if (Word(b) != static_cast<uint64_t>(i) + 1) Die("channel: wrong reply");
    if (i >= kWarmup) {
      rtt.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
  }
  return rtt;
}

std::vector<double> ParentRing(bufpool::internal::TokenRing& out,
                               bufpool::internal::TokenRing& in, int n) {
  std::vector<double> rtt;
  rtt.reserve(n);
  for (int i = 0; i < n; ++i) {
    const Clock::time_point t0 = Clock::now();
    if (!out.HasRoom()) Die("ring: full");
    out.Push(i);
    uint64_t token;
    while (!in.Front(&token)) {
    }
    in.Pop();
    const Clock::time_point t1 = Clock::now();
    if (token != static_cast<uint64_t>(i) + 1) Die("ring: wrong reply");
    if (i >= kWarmup) {
      rtt.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
  }
  return rtt;
}

std::vector<double> ParentLine(Line* ping, Line* pong, int n, int run) {
  std::vector<double> rtt;
  rtt.reserve(n);
  const uint64_t base = static_cast<uint64_t>(run) * n;
  for (uint64_t i = base + 1; i <= base + n; ++i) {
    const Clock::time_point t0 = Clock::now();
    ping->word.store(i, std::memory_order_release);
    while (pong->word.load(std::memory_order_acquire) != i) {
    }
    const Clock::time_point t1 = Clock::now();
    if (i > base + kWarmup) {
      rtt.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
  }
  return rtt;
}

std::vector<double> ParentSocket(int fd, int n) {
  alignas(64) static char buf[kBytes];
  std::vector<double> rtt;
  rtt.reserve(n);
  for (int i = 0; i < n; ++i) {
    uint64_t w = i;
    std::memcpy(buf, &w, sizeof(w));
    const Clock::time_point t0 = Clock::now();
    if (!WriteAll(fd, buf, kBytes) || !ReadAll(fd, buf, kBytes)) {
      Die("socket: parent's I/O failed");
    }
    const Clock::time_point t1 = Clock::now();
    std::memcpy(&w, buf, sizeof(w));
    if (w != static_cast<uint64_t>(i) + 1) Die("socket: wrong reply");
    if (i >= kWarmup) {
      rtt.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
  }
  return rtt;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  int iters = 50000;
  int cpu_a = -1, cpu_b = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--rounds") {
      rounds = std::atoi(next().c_str());
    } else if (a == "--iters") {
      iters = std::atoi(next().c_str());
    } else if (a == "--cpus") {
      const std::string v = next();
      if (std::sscanf(v.c_str(), "%d,%d", &cpu_a, &cpu_b) != 2) {
        Die("--cpus takes two CPU numbers, A,B: got '" + v + "'");
      }
    } else {
      Die("unknown argument '" + a + "' (--rounds N --iters N --cpus A,B)");
    }
  }
  if (rounds < 1 || iters < 1) Die("--rounds and --iters must be >= 1");
  if (cpu_a < 0) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) Die("sched_getaffinity");
    for (int c = 0; c < CPU_SETSIZE && cpu_b < 0; ++c) {
      if (!CPU_ISSET(c, &set)) continue;
      (cpu_a < 0 ? cpu_a : cpu_b) = c;
    }
    if (cpu_b < 0) Die("needs two CPUs to pin the two processes to");
  }
  const int total = iters + kWarmup;

  bufpool::PoolOptions options;
  options.buffer_size = kBytes;
  options.buffer_count = 256;
  options.shared = true;
  auto pool = BufferPool::Create(options);
  if (!pool.ok()) Die("shared pool: " + pool.status().ToString());
  auto to_child = BufferChannel::Create(**pool, 64);
  auto to_parent = BufferChannel::Create(**pool, 64);
  if (!to_child.ok() || !to_parent.ok()) Die("channels: create failed");
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) Die("socketpair");
  constexpr bufpool::internal::RingIdentity kRingId{.buffer_size = 1};
  auto ring_to_child = bufpool::internal::TokenRing::Create(64, kRingId);
  auto ring_to_parent = bufpool::internal::TokenRing::Create(64, kRingId);
  if (!ring_to_child.ok() || !ring_to_parent.ok()) Die("rings: create failed");
  void* lines = mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (lines == MAP_FAILED) Die("mmap");
  Line* ping = new (lines) Line[2];
  Line* pong = ping + 1;

  const pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    close(sv[0]);
    Pin(cpu_b);
    auto joined = BufferPool::Join((*pool)->shared_fd());
    if (!joined.ok()) Die("child: Join: " + joined.status().ToString());
    auto in = BufferChannel::Join(**joined, (*to_child)->memory_fd(),
                                  (*to_child)->event_fd());
    auto out = BufferChannel::Join(**joined, (*to_parent)->memory_fd(),
                                   (*to_parent)->event_fd());
    if (!in.ok() || !out.ok()) Die("child: joining the channels failed");
    auto ring_in = bufpool::internal::TokenRing::Join(
        (*ring_to_child)->memory_fd(), (*ring_to_child)->event_fd(), kRingId);
    auto ring_out = bufpool::internal::TokenRing::Join(
        (*ring_to_parent)->memory_fd(), (*ring_to_parent)->event_fd(), kRingId);
    if (!ring_in.ok() || !ring_out.ok()) Die("child: joining the rings failed");
    for (int r = 0; r < rounds; ++r) {
      for (int k = 0; k < 4; ++k) {
        switch ((r + k) % 4) {
          case 0:
            ChildChannel(**in, **out, total);
            break;
          case 1:
            ChildRing(**ring_in, **ring_out, total);
            break;
          case 2:
            ChildSocket(sv[1], total);
            break;
          case 3:
            ChildLine(ping, pong, total, r);
            break;
        }
      }
    }
    in->reset();
    out->reset();
    joined->reset();
    _exit(0);
  }
  close(sv[1]);
  Pin(cpu_a);
  std::fprintf(stderr,
               "channel_handoff: parent on CPU %d, child on CPU %d, %d round "
               "trips a contender a round, %d rounds; one-way = RTT / 2\n",
               cpu_a, cpu_b, iters, rounds);
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> ch, ring, so, line;
    for (int k = 0; k < 4; ++k) {
      switch ((r + k) % 4) {
        case 3:
          line = ParentLine(ping, pong, total, r);
          break;
        case 0:
          ch = ParentChannel(**pool, **to_child, **to_parent, total);
          break;
        case 1:
          ring = ParentRing(**ring_to_child, **ring_to_parent, total);
          break;
        case 2:
          so = ParentSocket(sv[0], total);
          break;
      }
    }
    const double c50 = Percentile(ch, 0.5) / 2, c99 = Percentile(ch, 0.99) / 2;
    const double r50 = Percentile(ring, 0.5) / 2,
                 r99 = Percentile(ring, 0.99) / 2;
    const double s50 = Percentile(so, 0.5) / 2, s99 = Percentile(so, 0.99) / 2;
    const double l50 = Percentile(line, 0.5) / 2;
    std::printf(
        "{\"contender\": \"channel_handoff\", \"channel_oneway_p50_ns\": "
        "%.1f, \"channel_oneway_p99_ns\": %.1f, \"ring_oneway_p50_ns\": "
        "%.1f, \"ring_oneway_p99_ns\": %.1f, \"line_oneway_p50_ns\": %.1f, "
        "\"channel_vs_line_p50\": %.2f, \"socket_oneway_p50_ns\": "
        "%.1f, \"socket_oneway_p99_ns\": %.1f, \"socket_vs_channel_p50\": "
        "%.2f}\n",
        c50, c99, r50, r99, l50, c50 / l50, s50, s99, s50 / c50);
    std::fflush(stdout);
    std::fprintf(stderr,
                 "round %d: channel one-way p50 %.0f ns p99 %.0f ns | raw "
                 "ring p50 %.0f ns p99 %.0f ns | one line p50 %.0f ns | "
                 "socket pair p50 %.0f ns p99 %.0f ns | socket/channel p50 "
                 "%.1fx | channel/line %.2f\n",
                 r + 1, c50, c99, r50, r99, l50, s50, s99, s50 / c50,
                 c50 / l50);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    Die("the child failed");
  }
  (*pool)->ReclaimDead();
  to_child->reset();
  to_parent->reset();
  return 0;
}
