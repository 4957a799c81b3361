// libbufpool with Asio (standalone Asio, as in Debian's libasio-dev; tested
// with 1.22): header-only, included only by programs that use Asio; the
// library itself does not depend on it.
//
// Writing. AsioBuffers(chain) is a ConstBufferSequence over the chain's
// slices, no copy, for asio::write / asio::async_write / write_some:
//
//   size_t n = asio::write(socket, bufpool::AsioBuffers(chain), ec);
//   chain.Consume(n);                       // or bufpool::AsioWrite(...)
//
//   asio::async_write(socket, bufpool::AsioBuffers(chain),
//                     [&chain](asio::error_code ec, size_t n) {
//                       chain.Consume(n);
//                     });
//
// Reading into fresh pool buffers. AsioReadBuffers takes up to max_bytes of
// free buffers from a pool; buffers() is a MutableBufferSequence over them;
// CommitTo(chain, n) links the n bytes the read put there into a chain and
// returns the buffers it did not fill:
//
//   auto rb = std::make_shared<bufpool::AsioReadBuffers>(pool, 64 * 1024);
//   socket.async_read_some(rb->buffers(),
//       [rb, &chain](asio::error_code ec, size_t n) { rb->CommitTo(chain, n);
//       });
//
// Memory. A chain fed only by CommitTo() (or AsioReadSome()) that holds B
// bytes not yet consumed pins at most B + 2 * buffer_size of its pool
// however small the reads were, plus the buffers of the read in flight
// (max_bytes rounded up to whole buffers, at most kMaxBuffers): small reads
// are copied into the chain's tail instead of linking a buffer each. For
// connections that may trickle, keep max_bytes near one buffer_size, or
// wait for readability (socket.async_wait(wait_read)) and then read with
// AsioReadSome(), which pins nothing while waiting.
//
// Waiting for a free buffer. When the pool is dry (AsioReadSome() sets
// asio::error::no_buffer_space), AsioFreeBufferWaiter waits for the next
// free buffer without a timer and without blocking a thread; it is
// BufferPool::NotifyWhenFree() on an eventfd that Asio watches:
//
//   bufpool::AsioFreeBufferWaiter waiter(socket.get_executor(), pool);
//   waiter.AsyncWait([&](asio::error_code ec) { if (!ec) TryReadAgain(); });
//   co_await waiter.AsyncWait(asio::use_awaitable);   // in a coroutine
//
// Ownership and lifetime. AsioBuffers() views the chain: keep the chain
// alive and unchanged until the operation completes. buffers() views the
// AsioReadBuffers: keep it alive (e.g. in a shared_ptr held by the handler)
// until the read completes. Buffers that are never committed go back to the
// pool when the AsioReadBuffers is destroyed.
//
// Thread safety: as BufferChain; one thread at a time per object (an Asio
// strand, or one io_context thread, gives that).
#ifndef BUFPOOL_ASIO_H_
#define BUFPOOL_ASIO_H_

#include <sys/eventfd.h>
#include <unistd.h>

#include <asio/async_result.hpp>
#include <asio/buffer.hpp>
#include <asio/compose.hpp>
#include <asio/error.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/write.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <system_error>
#include <utility>
#include <vector>

// The Asio namespace and error type this header is written against, in one
// place (Boost.Asio spells them boost::asio and boost::system::error_code).
namespace bufpool::asio_ns {
namespace asio = ::asio;
using error_code = ::asio::error_code;
}  // namespace bufpool::asio_ns

#include "absl/types/span.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"

namespace bufpool {

// A ConstBufferSequence over a chain's slices (see the file comment).
// Cheap to copy: it holds a pointer to the chain.
class AsioConstBuffers {
 public:
  using value_type = asio_ns::asio::const_buffer;

  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = asio_ns::asio::const_buffer;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = value_type;

    const_iterator() = default;
    value_type operator*() const {
      const SharedBuffer& s = chain_->slice(i_);
      return value_type(s.data(), s.size());
    }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    const_iterator operator++(int) {
      const_iterator old = *this;
      ++i_;
      return old;
    }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }

   private:
    friend class AsioConstBuffers;
    const_iterator(const BufferChain* chain, size_t i) : chain_(chain), i_(i) {}
    const BufferChain* chain_ = nullptr;
    size_t i_ = 0;
  };

  explicit AsioConstBuffers(const BufferChain& chain) : chain_(&chain) {}
  const_iterator begin() const { return {chain_, 0}; }
  const_iterator end() const { return {chain_, chain_->slice_count()}; }

 private:
  const BufferChain* chain_;
};

inline AsioConstBuffers AsioBuffers(const BufferChain& chain) {
  return AsioConstBuffers(chain);
}

// Up to kMaxBuffers fresh pool buffers for one read (see the file comment).
// Move-only (it owns the buffers); buffers() is the copyable sequence.
class AsioReadBuffers {
 public:
  static constexpr size_t kMaxBuffers = 64;

  // Takes the buffers max_bytes needs (at most kMaxBuffers) that `pool` has
  // free now; empty() when it has none.
  AsioReadBuffers(BufferPool& pool, size_t max_bytes) {
    Take(pool, nullptr, max_bytes);
  }
  // For a read into `chain`: its pool's buffers, and when the chain is
  // bound to a budget (bufpool/budget.h) only as many as the budget may
  // still pin, drawn as the chain draws them (the budget's reserve first);
  // empty() when the budget is at its limit (then nothing is read, and
  // nothing is lost: the bytes stay in the socket) or the pool is dry. The
  // chain must be the one CommitTo() is given.
  AsioReadBuffers(BufferChain& chain, size_t max_bytes) {
    if (chain.pool() == nullptr) return;
    BufferBudget* const budget = chain.budget();
    if (budget != nullptr) {
      const size_t most = budget->room_bytes() / chain.pool()->buffer_size() *
                          chain.pool()->buffer_size();
      if (max_bytes > most) max_bytes = most;
    }
    Take(*chain.pool(), budget, max_bytes);
  }
  AsioReadBuffers(const AsioReadBuffers&) = delete;
  AsioReadBuffers& operator=(const AsioReadBuffers&) = delete;
  ~AsioReadBuffers() { GiveBackAll(); }

  bool empty() const { return count_ == 0; }
  // The MutableBufferSequence to read into.
  absl::Span<const asio_ns::asio::mutable_buffer> buffers() const {
    return {views_, count_};
  }

  // Puts the first `n` bytes read into buffers() at the end of `chain` and
  // returns the buffers left unfilled to their pool. Call once. Each filled
  // buffer goes through BufferChain::Receive() (copy_below: buffer_size /
  // 8, unless `options` says otherwise): a read that fits the chain's tail
  // room is copied there, one that finds some room fills it and a fresh
  // buffer, and the rest are linked, no copy; with options.pack, a short
  // read into an empty chain is packed. So memory follows bytes (see the
  // file comment).
  //
  // Returns OK, or, for a chain bound to a budget that these bytes took
  // past its max_bytes (a read made into buffers taken without the budget:
  // AsioReadBuffers(pool, ...)), ResourceExhausted naming the budget: the
  // bytes are in the chain all the same (nothing is lost); stop reading
  // until it drains.
  absl::Status CommitTo(BufferChain& chain, size_t n) {
    return CommitTo(
        chain, n,
        {.copy_below = count_ != 0 ? bufs_[0].size() / 8 : 0, .pack = nullptr});
  }
  absl::Status CommitTo(BufferChain& chain, size_t n,
                        const BufferChain::ReceiveOptions& options) {
    BufferBudget* const budget = chain.budget();
    const size_t before = budget != nullptr ? budget->pinned_bytes() : 0;
    chain.Reserve(chain.slice_count() + count_ + 1);
    for (size_t i = 0; i < count_ && n != 0; ++i) {
      const size_t len = n < views_[i].size() ? n : views_[i].size();
      chain.Receive(bufs_[i], len, options);  // a copied one goes back below
      n -= len;
    }
    GiveBackAll();
    if (budget != nullptr && budget->pinned_bytes() > before &&
        budget->pinned_bytes() > budget->max_bytes()) [[unlikely]] {
      return internal::BudgetAccess::Refuse(
          *budget, "AsioReadBuffers::CommitTo", 0,
          "the bytes read were kept in the chain: stop reading until it "
          "drains");
    }
    return absl::OkStatus();
  }

 private:
  void Take(BufferPool& pool, BufferBudget* budget, size_t max_bytes) {
    budget_ = budget;
    const size_t bs = pool.buffer_size();
    size_t want = (max_bytes + bs - 1) / bs;
    if (want > kMaxBuffers) want = kMaxBuffers;
    for (; count_ < want; ++count_) {
      bufs_[count_] = budget != nullptr
                          ? internal::BudgetAccess::TakeFresh(*budget)
                          : pool.TryAcquire();
      if (!bufs_[count_]) break;
      const size_t len =
          max_bytes - count_ * bs < bs ? max_bytes - count_ * bs : bs;
      views_[count_] = asio_ns::asio::mutable_buffer(bufs_[count_].data(), len);
    }
  }
  // The buffers no chain took go back: to the budget they came from (its
  // reserve), or the pool.
  void GiveBackAll() {
    for (size_t i = 0; i < count_; ++i) {
      if (budget_ != nullptr) {
        internal::BudgetAccess::GiveBack(*budget_, std::move(bufs_[i]));
      }
      bufs_[i].Reset();
    }
    count_ = 0;
  }

  BufferBudget* budget_ = nullptr;
  Buffer bufs_[kMaxBuffers];
  asio_ns::asio::mutable_buffer views_[kMaxBuffers];
  size_t count_ = 0;
};

// Writes all of `chain` with asio::write and consumes what was written
// (all of it unless `ec` is set).
template <typename SyncWriteStream>
size_t AsioWrite(SyncWriteStream& stream, BufferChain& chain,
                 asio_ns::error_code& ec) {
  const size_t n = asio_ns::asio::write(stream, AsioBuffers(chain), ec);
  chain.Consume(n);
  return n;
}

// One read_some of up to max_bytes into fresh buffers of chain.pool(),
// put at the end of `chain` as CommitTo() does. Returns the bytes read; with
// none free, or the chain's budget at its limit (see AsioReadBuffers(chain,
// max_bytes)), sets `ec` to asio::error::no_buffer_space and reads nothing.
template <typename SyncReadStream>
size_t AsioReadSome(SyncReadStream& stream, BufferChain& chain,
                    size_t max_bytes, asio_ns::error_code& ec) {
  if (chain.pool() == nullptr) {
    ec = asio_ns::asio::error::invalid_argument;
    return 0;
  }
  AsioReadBuffers rb(chain, max_bytes);
  if (rb.empty()) {
    ec = asio_ns::asio::error::no_buffer_space;
    return 0;
  }
  const size_t n = stream.read_some(rb.buffers(), ec);
  (void)rb.CommitTo(chain, n);  // within the budget: never refused
  return n;
}

// Waits, without blocking a thread, until a buffer of one pool is free: the
// asynchronous form of BufferPool::NotifyWhenFree(), on an eventfd of its
// own that an asio::posix::stream_descriptor watches.
//
// A completion with no error means a buffer was free at some moment at or
// after AsyncWait() was called (at once when one is free then); another
// thread may have taken it since, so try TryAcquire() or the read again, and
// wait again if the pool is dry. One wait at a time per waiter.
//
// Cancellation. Cancel(), or a per-operation cancellation signal
// (asio::bind_cancellation_slot), completes the wait in flight with
// asio::error::operation_aborted. The pool's request stays registered
// until the pool's next free buffer fires it; the next AsyncWait() reuses
// it rather than adding another.
//
// Ownership and lifetime. The waiter owns its eventfd. The pool must
// outlive the waiter. A waiter destroyed while the pool may still write to
// its eventfd (a request not yet fired) does not close the descriptor then:
// it is kept open until the notice has come (checked when the next waiter
// is made), so the pool never writes to a closed or reused descriptor; if
// the pool is destroyed before its next free buffer, that descriptor stays
// open until the process ends.
//
// Thread safety: one thread at a time per waiter (as any Asio I/O object:
// an io_context thread or a strand); the pool it waits on may be used and
// released into from any thread.
class AsioFreeBufferWaiter {
 public:
  // Makes the eventfd and watches it on `executor_or_context`. Throws
  // std::system_error (as Asio's constructors do) when no eventfd can be
  // made or the reactor cannot watch it; nothing is left open then.
  template <typename ExecutorOrContext>
  AsioFreeBufferWaiter(ExecutorOrContext&& executor_or_context,
                       BufferPool& pool)
      : pool_(&pool),
        descriptor_(std::forward<ExecutorOrContext>(executor_or_context)) {
    const int fd = MakeEventFd();
    try {
      descriptor_.assign(fd);  // throws when the reactor refuses the fd
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
  AsioFreeBufferWaiter(const AsioFreeBufferWaiter&) = delete;
  AsioFreeBufferWaiter& operator=(const AsioFreeBufferWaiter&) = delete;

  ~AsioFreeBufferWaiter() {
    if (!descriptor_.is_open()) return;
    const int fd = descriptor_.release();  // aborts the wait in flight
    if (pending_ && !Drain(fd)) {
      Parked().Park(fd);  // the pool may still write to it
    } else {
      ::close(fd);
    }
  }

  // Starts the wait (see the class comment). The token's signature is
  // void(asio::error_code): callbacks, asio::use_awaitable, use_future.
  // Errors: operation_aborted on cancellation, no_memory when the pool
  // could not record the request.
  template <typename CompletionToken>
  auto AsyncWait(CompletionToken&& token) {
    return asio_ns::asio::async_compose<CompletionToken,
                                        void(asio_ns::error_code)>(
        WaitOp{this}, token, descriptor_);
  }

  // Completes the wait in flight, if any, with operation_aborted.
  void Cancel() { descriptor_.cancel(); }

  // The executor the eventfd is watched on.
  auto get_executor() { return descriptor_.get_executor(); }

 private:
  // The composed operation: register with the pool (unless a request of
  // ours is still pending), then wait for the eventfd to be readable.
  // Only the first step touches the waiter, and it runs inside
  // AsyncWait(); the completion may run after the waiter is gone.
  struct WaitOp {
    AsioFreeBufferWaiter* waiter;
    bool started = false;

    template <typename Self>
    void operator()(Self& self, asio_ns::error_code ec = {}) {
      if (started) return self.complete(ec);
      started = true;
      ec = waiter->Arm();
      if (ec) {
        auto ex = waiter->descriptor_.get_executor();
        asio_ns::asio::post(
            ex, [self = std::move(self), ec]() mutable { self(ec); });
        return;
      }
      waiter->descriptor_.async_wait(
          asio_ns::asio::posix::stream_descriptor::wait_read, std::move(self));
    }
  };

  // Drops a notice already read or left over, and asks the pool for the
  // next one unless the last request has not fired yet (at most one
  // request of this eventfd is ever registered, so at most one write to it
  // is ever outstanding).
  asio_ns::error_code Arm() {
    const int fd = descriptor_.native_handle();
    if (Drain(fd)) pending_ = false;
    if (pending_) return {};
    if (!pool_->NotifyWhenFree(fd).ok()) {
      return asio_ns::asio::error::no_memory;
    }
    pending_ = true;
    return {};
  }

  static int MakeEventFd() {
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
      throw std::system_error(errno, std::generic_category(),
                              "AsioFreeBufferWaiter: eventfd");
    }
    Parked().Reap();
    return fd;
  }

  // Reads the eventfd's count; true when a notice had come.
  static bool Drain(int fd) {
    uint64_t count = 0;
    ssize_t n;
    do {
      n = ::read(fd, &count, sizeof(count));
    } while (n < 0 && errno == EINTR);
    return n == static_cast<ssize_t>(sizeof(count));
  }

  // Eventfds of destroyed waiters that a pool may still write to, closed
  // once their notice has come.
  class ParkedFds {
   public:
    void Park(int fd) {
      const std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
    }
    void Reap() {
      const std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < fds_.size();) {
        if (Drain(fds_[i])) {
          ::close(fds_[i]);
          fds_[i] = fds_.back();
          fds_.pop_back();
        } else {
          ++i;
        }
      }
    }

   private:
    std::mutex mu_;
    std::vector<int> fds_;
  };
  static ParkedFds& Parked() {
    static ParkedFds* parked = new ParkedFds;  // never destroyed: no
    return *parked;                            // exit-order hazard
  }

  BufferPool* pool_;
  asio_ns::asio::posix::stream_descriptor descriptor_;
  bool pending_ = false;  // a request of ours may be in the pool's list
};

}  // namespace bufpool

#endif  // BUFPOOL_ASIO_H_
