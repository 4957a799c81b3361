// Fuzz target 1: BufferPool operation sequences against a plain model.
//
// The input picks up to three pools (buffer size, count, cache size,
// scrub) and then a sequence of operations on them: TryAcquire, Acquire with
// a zero or negative timeout, Reset, move-assignment, the bulk and raw calls,
// Detach/Adopt, FlushCaches. A "switch" operation runs the next few
// operations on a second thread (strictly handed over, so a run is
// deterministic). After every step:
//   * Stats() agrees with the model: in_use and acquire_failures exactly,
//     high_water at least the model's peak (exactly, with caches off),
//     capacity;
//   * an acquire that got nothing (or a short bulk fill) is allowed only when
//     no buffer is free (it drains every CPU's cache before it answers
//     empty; HiddenBound);
//   * every buffer out is a distinct slot start of its pool, and the stamp
//     written into its first and last 8 bytes is intact; a scrubbing pool
//     hands out only zeroed buffers.
// Misuse the input asks for (double release, a pointer inside a buffer,
// another pool's buffer, a double Adopt) runs at most once per input in a
// forked child, which must abort with the pool's message.
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "fuzz_check.h"

namespace {

using bufpool::Buffer;
using bufpool::BufferPool;

constexpr int kThreads = 2;  // 0: the fuzzer's thread; 1: the worker

// A second thread that runs one job at a time, handed over and back, so the
// interleaving is the input's, not the scheduler's. Lives for the process.
class Worker {
 public:
  Worker() : thread_([this] { Loop(); }) {}
  void Run(const std::function<void()>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    cv_.notify_all();
    cv_.wait(lock, [&] { return job_ == nullptr; });
  }

 private:
  [[noreturn]] void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return job_ != nullptr; });
      (*job_)();
      job_ = nullptr;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;
  std::thread thread_;
};

Worker& TheWorker() {
  static Worker* w = new Worker();  // never destroyed: the thread runs on
  return *w;
}

struct Out {
  std::byte* p;
  uint64_t stamp;
};

struct PoolModel {
  std::unique_ptr<BufferPool> pool;
  bool scrub = false;
  std::vector<Buffer> handles;
  std::vector<uint64_t> handle_stamps;  // parallel to handles
  std::vector<Out> raws;
  std::vector<char> out;  // per slot: out now (as a handle or raw)
  size_t in_use = 0;
  size_t peak = 0;
  uint64_t failures = 0;
  bool touched[kThreads] = {};  // that thread may cache free buffers
  bool used_by[kThreads] = {};  // that thread ever called into the pool
};

uint64_t g_next_stamp = 1;

// Not instrumented for coverage: its loop would only slow the fuzzer.
__attribute__((no_sanitize("coverage"))) size_t FirstNonZero(const std::byte* p,
                                                             size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != std::byte{0}) return i;
  }
  return n;
}

void WriteStamp(std::byte* p, size_t size, uint64_t stamp) {
  std::memcpy(p, &stamp, 8);
  std::memcpy(p + size - 8, &stamp, 8);
}

void CheckStamp(const std::byte* p, size_t size, uint64_t stamp) {
  uint64_t a, b;
  std::memcpy(&a, p, 8);
  std::memcpy(&b, p + size - 8, 8);
  FUZZ_CHECK(a == stamp && b == stamp,
             "buffer %p: stamp %llu expected, found %llu / %llu",
             static_cast<const void*>(p), (unsigned long long)stamp,
             (unsigned long long)a, (unsigned long long)b);
}

class Session {
 public:
  explicit Session(FuzzedDataProvider& in) : in_(in) {}

  void Run() {
    const int npools = in_.ConsumeIntegralInRange<int>(1, 3);
    for (int i = 0; i < npools; ++i) {
      if (!CreatePool()) return;
    }
    int steps = 0;
    while (in_.remaining_bytes() > 0 && steps++ < 512) {
      Step(/*thread=*/0);
    }
    for (PoolModel& m : pools_) Drain(m);
  }

 private:
  bool CreatePool() {
    PoolModel m;
    bufpool::PoolOptions o;
    o.buffer_size = size_t{64} << in_.ConsumeIntegralInRange<int>(0, 6);
    o.buffer_count = in_.ConsumeBool()
                         ? in_.ConsumeIntegralInRange<size_t>(1, 24)
                         : in_.ConsumeIntegralInRange<size_t>(25, 600);
    const uint8_t cache = in_.ConsumeIntegral<uint8_t>();
    o.cache_size = cache < 32 ? 0 : cache < 224 ? cache % 65 : 512;
    o.scrub_on_release = in_.ConsumeIntegralInRange<int>(0, 7) == 0;
    o.huge_pages = bufpool::HugePages::kNever;
    o.populate = false;
    auto pool = BufferPool::Create(o);
    FUZZ_CHECK(pool.ok(), "Create: %s", pool.status().ToString().c_str());
    m.pool = std::move(*pool);
    m.scrub = o.scrub_on_release;
    m.out.assign(o.buffer_count, 0);
    FUZZ_CHECK(m.pool->capacity() == o.buffer_count, "capacity");
    FUZZ_CHECK(
        m.pool->cache_capacity() == std::min(o.cache_size, o.buffer_count / 8),
        "cache_capacity %zu for cache_size %zu, count %zu",
        m.pool->cache_capacity(), o.cache_size, o.buffer_count);
    pools_.push_back(std::move(m));
    return true;
  }

  // Free buffers TryAcquire() on `thread` may not see: none, since it
  // drains every CPU's cache before it answers empty.
  size_t HiddenBound(const PoolModel&, int) const { return 0; }

  // A buffer just handed out: a free slot start of this pool, zeroed when
  // the pool scrubs; stamped now.
  uint64_t TakeOut(PoolModel& m, std::byte* p) {
    BufferPool& pool = *m.pool;
    FUZZ_CHECK(pool.Contains(p), "acquired %p outside the region",
               static_cast<void*>(p));
    const uint32_t slot = pool.SlotOf(p);
    FUZZ_CHECK(pool.SlotData(slot) == p, "acquired %p is not a slot start",
               static_cast<void*>(p));
    FUZZ_CHECK(!m.out[slot], "slot %u handed out twice", slot);
    const size_t size = pool.buffer_size();
    if (m.scrub) {
      const size_t i = FirstNonZero(p, size);
      FUZZ_CHECK(i == size,
                 "scrubbing pool handed out slot %u with byte %zu set", slot,
                 i);
    }
    m.out[slot] = 1;
    ++m.in_use;
    m.peak = std::max(m.peak, m.in_use);
    const uint64_t stamp = g_next_stamp++;
    WriteStamp(p, size, stamp);
    return stamp;
  }

  // Before a buffer goes back: its stamp is intact.
  void GiveBack(PoolModel& m, std::byte* p, uint64_t stamp) {
    CheckStamp(p, m.pool->buffer_size(), stamp);
    const uint32_t slot = m.pool->SlotOf(p);
    FUZZ_CHECK(m.out[slot], "model: slot %u not out", slot);
    m.out[slot] = 0;
    --m.in_use;
  }

  void AddHandle(PoolModel& m, Buffer b) {
    FUZZ_CHECK(b.pool() == m.pool.get(), "handle of another pool");
    FUZZ_CHECK(b.size() == m.pool->buffer_size(), "handle size %zu", b.size());
    FUZZ_CHECK(b.data() == m.pool->SlotData(b.slot()),
               "handle slot %u does not match data()", b.slot());
    const uint64_t stamp = TakeOut(m, b.data());
    m.handles.push_back(std::move(b));
    m.handle_stamps.push_back(stamp);
  }

  // Removes handle i (swapped with the last) and returns it, checked.
  Buffer TakeHandle(PoolModel& m, size_t i) {
    GiveBack(m, m.handles[i].data(), m.handle_stamps[i]);
    std::swap(m.handles[i], m.handles.back());
    std::swap(m.handle_stamps[i], m.handle_stamps.back());
    Buffer b = std::move(m.handles.back());
    m.handles.pop_back();
    m.handle_stamps.pop_back();
    return b;
  }

  Out TakeRaw(PoolModel& m, size_t i) {
    Out o = m.raws[i];
    GiveBack(m, o.p, o.stamp);
    m.raws[i] = m.raws.back();
    m.raws.pop_back();
    return o;
  }

  void Failed(PoolModel& m, int thread, const char* call) {
    ++m.failures;
    const size_t free_now = m.pool->capacity() - m.in_use;
    FUZZ_CHECK(free_now <= HiddenBound(m, thread),
               "%s on thread %d got nothing with %zu free buffers, of which "
               "the caches may hide at most %zu",
               call, thread, free_now, HiddenBound(m, thread));
  }

  void Check(PoolModel& m, int thread) {
    const bufpool::PoolStats s = m.pool->Stats();
    FUZZ_CHECK(s.capacity == m.pool->capacity(), "Stats().capacity");
    FUZZ_CHECK(s.in_use == m.in_use,
               "Stats().in_use %zu, model %zu (thread %d)", s.in_use, m.in_use,
               thread);
    FUZZ_CHECK(s.acquire_failures == m.failures,
               "Stats().acquire_failures %llu, model %llu",
               (unsigned long long)s.acquire_failures,
               (unsigned long long)m.failures);
    FUZZ_CHECK(s.acquire_timeouts == 0, "Stats().acquire_timeouts %llu",
               (unsigned long long)s.acquire_timeouts);
    FUZZ_CHECK(s.high_water >= m.peak && s.high_water <= s.capacity,
               "Stats().high_water %zu, model peak %zu, capacity %zu",
               s.high_water, m.peak, s.capacity);
    // Exact with caches off; with caches on, the free buffers of caches
    // other than the one that last moved count as in use (a thread may
    // migrate between CPUs), within the parking bound.
    if (m.pool->cache_capacity() == 0) {
      FUZZ_CHECK(s.high_water == m.peak,
                 "Stats().high_water %zu, exact peak %zu (caches off)",
                 s.high_water, m.peak);
    }
    FUZZ_CHECK(m.in_use == m.handles.size() + m.raws.size(), "model");
    const size_t size = m.pool->buffer_size();
    for (size_t i = 0; i < m.handles.size(); ++i) {
      CheckStamp(m.handles[i].data(), size, m.handle_stamps[i]);
    }
    for (const Out& o : m.raws) CheckStamp(o.p, size, o.stamp);
  }

  void Step(int thread) {
    PoolModel& m =
        pools_[in_.ConsumeIntegralInRange<size_t>(0, pools_.size() - 1)];
    BufferPool& pool = *m.pool;
    const int op = in_.ConsumeIntegralInRange<int>(0, 15);
    bool touches = true;  // the op may leave buffers in a CPU's cache
    switch (op) {
      case 0: {  // TryAcquire
        Buffer b = pool.TryAcquire();
        if (b) {
          AddHandle(m, std::move(b));
        } else {
          Failed(m, thread, "TryAcquire");
        }
        break;
      }
      case 1: {  // Acquire with a zero or negative timeout: a poll
        const absl::Duration t =
            in_.ConsumeBool() ? absl::ZeroDuration() : -absl::Nanoseconds(1);
        absl::StatusOr<Buffer> b = pool.Acquire(t);
        if (b.ok()) {
          FUZZ_CHECK(*b, "Acquire returned OK with an empty handle");
          AddHandle(m, std::move(*b));
        } else {
          FUZZ_CHECK(absl::IsDeadlineExceeded(b.status()) ||
                         absl::IsResourceExhausted(b.status()),
                     "Acquire(0): %s", b.status().ToString().c_str());
          Failed(m, thread, "Acquire(0)");
        }
        break;
      }
      case 2: {  // Reset a handle
        if (m.handles.empty()) break;
        Buffer b = TakeHandle(
            m, in_.ConsumeIntegralInRange<size_t>(0, m.handles.size() - 1));
        b.Reset();
        FUZZ_CHECK(!b && b.data() == nullptr && b.size() == 0,
                   "Reset handle not empty");
        break;
      }
      case 3: {  // move-assign one handle onto another: the target's goes
        if (m.handles.size() < 2) break;
        const size_t i =
            in_.ConsumeIntegralInRange<size_t>(0, m.handles.size() - 1);
        size_t j = in_.ConsumeIntegralInRange<size_t>(0, m.handles.size() - 2);
        if (j >= i) ++j;
        GiveBack(m, m.handles[i].data(), m.handle_stamps[i]);  // i's goes
        m.handles[i] = std::move(m.handles[j]);
        m.handle_stamps[i] = m.handle_stamps[j];
        FUZZ_CHECK(!m.handles[j], "moved-from handle not empty");
        std::swap(m.handles[j], m.handles.back());
        std::swap(m.handle_stamps[j], m.handle_stamps.back());
        m.handles.pop_back();
        m.handle_stamps.pop_back();
        break;
      }
      case 4: {  // TryAcquireRaw
        std::byte* p = pool.TryAcquireRaw();
        if (p != nullptr) {
          m.raws.push_back({p, TakeOut(m, p)});
        } else {
          Failed(m, thread, "TryAcquireRaw");
        }
        break;
      }
      case 5: {  // ReleaseRaw
        if (m.raws.empty()) break;
        Out o = TakeRaw(
            m, in_.ConsumeIntegralInRange<size_t>(0, m.raws.size() - 1));
        pool.ReleaseRaw(o.p);
        break;
      }
      case 6: {  // TryAcquireBulk, into a span that may hold handles already
        const size_t want = in_.ConsumeIntegralInRange<size_t>(0, 70);
        std::vector<Buffer> v(want);
        const size_t prefill =
            std::min(in_.ConsumeIntegralInRange<size_t>(0, 3),
                     std::min(want, m.handles.size()));
        for (size_t k = 0; k < prefill; ++k) {
          v[k] = TakeHandle(m, m.handles.size() - 1);  // released by the call
        }
        const size_t got = pool.TryAcquireBulk(absl::MakeSpan(v));
        FUZZ_CHECK(got <= want, "TryAcquireBulk %zu > %zu", got, want);
        for (size_t k = 0; k < want; ++k) {
          FUZZ_CHECK(static_cast<bool>(v[k]) == (k < got),
                     "TryAcquireBulk returned %zu but entry %zu is %s", got, k,
                     v[k] ? "set" : "empty");
        }
        for (size_t k = 0; k < got; ++k) AddHandle(m, std::move(v[k]));
        if (got < want) Failed(m, thread, "TryAcquireBulk");
        break;
      }
      case 7: {  // ReleaseBulk of some handles, with empty entries between
        const size_t n = in_.ConsumeIntegralInRange<size_t>(0, 70);
        std::vector<Buffer> v;
        for (size_t k = 0; k < n; ++k) {
          if (!m.handles.empty() && in_.ConsumeIntegralInRange<int>(0, 3)) {
            v.push_back(TakeHandle(m, in_.ConsumeIntegralInRange<size_t>(
                                          0, m.handles.size() - 1)));
          } else {
            v.emplace_back();
          }
        }
        pool.ReleaseBulk(absl::MakeSpan(v));
        for (const Buffer& b : v) {
          FUZZ_CHECK(!b, "ReleaseBulk left a handle set");
        }
        break;
      }
      case 8: {  // TryAcquireRawBulk
        const size_t want = in_.ConsumeIntegralInRange<size_t>(0, 70);
        std::vector<std::byte*> v(want, reinterpret_cast<std::byte*>(1));
        const size_t got = pool.TryAcquireRawBulk(absl::MakeSpan(v));
        FUZZ_CHECK(got <= want, "TryAcquireRawBulk %zu > %zu", got, want);
        for (size_t k = 0; k < want; ++k) {
          if (k < got) {
            FUZZ_CHECK(v[k] != nullptr, "raw bulk entry %zu null", k);
            m.raws.push_back({v[k], TakeOut(m, v[k])});
          } else {
            FUZZ_CHECK(v[k] == nullptr,
                       "TryAcquireRawBulk returned %zu; entry %zu not null",
                       got, k);
          }
        }
        if (got < want) Failed(m, thread, "TryAcquireRawBulk");
        break;
      }
      case 9: {  // ReleaseRawBulk of some raws, nulls between
        const size_t n = in_.ConsumeIntegralInRange<size_t>(0, 70);
        std::vector<std::byte*> v;
        for (size_t k = 0; k < n; ++k) {
          if (!m.raws.empty() && in_.ConsumeIntegralInRange<int>(0, 3)) {
            v.push_back(TakeRaw(m, in_.ConsumeIntegralInRange<size_t>(
                                       0, m.raws.size() - 1))
                            .p);
          } else {
            v.push_back(nullptr);
          }
        }
        const std::vector<std::byte*> copy = v;
        pool.ReleaseRawBulk(v);
        FUZZ_CHECK(v == copy, "ReleaseRawBulk changed its input");
        break;
      }
      case 10: {  // Detach: a handle becomes a raw pointer
        if (m.handles.empty()) break;
        const size_t i =
            in_.ConsumeIntegralInRange<size_t>(0, m.handles.size() - 1);
        const uint64_t stamp = m.handle_stamps[i];
        std::byte* want = m.handles[i].data();
        std::byte* p = m.handles[i].Detach();
        FUZZ_CHECK(p == want && !m.handles[i], "Detach");
        std::swap(m.handles[i], m.handles.back());
        std::swap(m.handle_stamps[i], m.handle_stamps.back());
        m.handles.pop_back();
        m.handle_stamps.pop_back();
        m.raws.push_back({p, stamp});
        touches = false;
        break;
      }
      case 11: {  // Adopt: a raw pointer becomes a handle
        if (m.raws.empty()) break;
        const size_t i =
            in_.ConsumeIntegralInRange<size_t>(0, m.raws.size() - 1);
        const Out o = m.raws[i];
        m.raws[i] = m.raws.back();
        m.raws.pop_back();
        Buffer b = pool.Adopt(o.p);
        FUZZ_CHECK(b && b.data() == o.p && b.pool() == &pool, "Adopt");
        m.handles.push_back(std::move(b));
        m.handle_stamps.push_back(o.stamp);
        touches = false;
        break;
      }
      case 12: {  // FlushCaches
        pool.FlushCaches();
        m.touched[thread] = false;
        touches = false;
        break;
      }
      case 13: {  // the next few steps run on the other thread
        touches = false;
        if (thread != 0) break;
        const int n = in_.ConsumeIntegralInRange<int>(1, 16);
        const std::function<void()> job = [&] {
          for (int k = 0; k < n && in_.remaining_bytes() > 0; ++k) Step(1);
        };
        TheWorker().Run(job);
        break;
      }
      case 14: {  // misuse, in a forked child (once per input)
        touches = false;
        // A fork costs as much as a hundred inputs, so the op needs a second
        // byte to match: only a few inputs in the corpus fork.
        if (in_.ConsumeIntegral<uint8_t>() != 0x4d) break;
        if (thread != 0 || forked_) break;
        forked_ = true;
        Misuse(m, in_.ConsumeIntegralInRange<int>(0, 5));
        break;
      }
      default:  // 15: nothing; a Stats() check
        touches = false;
        break;
    }
    if (touches) {
      m.touched[thread] = true;
      m.used_by[thread] = true;
    }
    Check(m, thread);
  }

  // Runs one misuse in a child, which must die of SIGABRT having printed
  // `expect`. Skipped when the input's state cannot make that misuse.
  void Misuse(PoolModel& m, int kind) {
    BufferPool& pool = *m.pool;
    std::byte* p = nullptr;
    const char* expect = nullptr;
    int call = 0;  // 0 ReleaseRaw, 1 ReleaseRawBulk, 2 Adopt
    switch (kind) {
      case 0:  // release of a buffer a handle owns
        if (m.handles.empty()) return;
        p = m.handles.back().data();
        expect = "double release of slot";
        break;
      case 1:  // release of a free buffer (one out, released twice below)
      case 2:  // Adopt of a free buffer
        if (m.raws.empty()) return;
        p = m.raws.back().p;
        expect = "double release of slot";
        call = kind == 1 ? 0 : 2;
        break;
      case 3: {  // a pointer inside a buffer
        if (m.raws.empty()) return;
        p = m.raws.back().p + 8;
        expect = "is not from this pool";
        break;
      }
      case 4: {  // another pool's buffer
        for (PoolModel& other : pools_) {
          if (&other != &m && !other.raws.empty()) p = other.raws.back().p;
        }
        if (p == nullptr) return;
        expect = "is not from this pool";
        call = 1;
        break;
      }
      case 5:  // release of a buffer a handle owns, in a bulk release
        if (m.handles.empty()) return;
        p = m.handles.back().data();
        expect = "ReleaseRawBulk: double release of slot";
        call = 1;
        break;
    }
    int fds[2];
    FUZZ_CHECK(pipe2(fds, O_CLOEXEC) == 0, "pipe");
    const pid_t pid = fork();
    FUZZ_CHECK(pid >= 0, "fork");
    if (pid == 0) {
      // The child: libFuzzer's SIGABRT handler would report a crash.
      signal(SIGABRT, SIG_DFL);
      dup2(fds[1], 2);
      if (kind == 1 || kind == 2) pool.ReleaseRaw(p);  // legitimately, first
      if (call == 0) pool.ReleaseRaw(p);
      if (call == 1) {
        std::byte* v[3] = {nullptr, p, nullptr};
        pool.ReleaseRawBulk(v);
      }
      if (call == 2) (void)pool.Adopt(p).Detach();
      _exit(0);  // no abort: the parent reports it
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      err.append(buf, static_cast<size_t>(n));
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    FUZZ_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
               "misuse %d did not abort (status %d, stderr '%s')", kind, status,
               err.c_str());
    FUZZ_CHECK(err.find(expect) != std::string::npos,
               "misuse %d: expected '%s' in '%s'", kind, expect, err.c_str());
  }

  void Drain(PoolModel& m) {
    m.used_by[0] = m.touched[0] = true;
    while (!m.handles.empty()) TakeHandle(m, 0).Reset();
    std::vector<std::byte*> raw;
    while (!m.raws.empty()) raw.push_back(TakeRaw(m, 0).p);
    m.pool->ReleaseRawBulk(raw);
    Check(m, 0);
    FUZZ_CHECK(m.pool->Stats().in_use == 0, "in_use after draining");
  }

  FuzzedDataProvider& in_;
  std::vector<PoolModel> pools_;
  bool forked_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Session(in).Run();
  return 0;
}
