// CopyTree: a depth-first walk that recreates directories, links and nodes
// and copies regular files several at once; each entry's failure is
// recorded and the walk goes on.
//
// Directories and symbolic links are made by ring operations (mkdirat,
// symlinkat) where the kernel has them (5.15; probed once with the ring),
// else by system calls on the walking thread; a directory is listed once
// its mkdir has completed.
//
// Regular files take one of two paths:
//   * the ring (tree_ring.cc): a file of at most one buffer, listed as a
//     regular file, going into a directory this walk created, is copied by
//     io_uring operations that the walking thread submits and completes,
//     many files in flight through one ring;
//   * CopyFile, on kFileWorkers worker threads: every other file (larger,
//     sparse, into a directory merged into, or options the ring does not
//     implement: kAtomic, O_DIRECT, fsync), and every file when the ring is
//     unavailable (no io_uring, an operation missing from the kernel's
//     probe): then the walk is the threaded one alone.
//
// Order: directories are created as their parent is listed and listed
// later, a few at a time; the regular files of the listed directories are
// handed out one from each in turn. Creating a file takes its directory's
// lock, so files in flight from several directories are created in
// parallel where files of one directory would wait for each other. Memory
// is a few directories' names plus the directories not yet listed.
//
// Threads: the walking thread (the caller, which also drives the ring) and
// the workers. What they share (the queue of files, TreeStats) is guarded by
// one mutex each; nothing is read without it, so the mutexes give all the
// ordering needed.
// Directory modes and times are set by the walking thread after every
// worker has finished, deepest first: creating entries changes a
// directory's times, and a read-only directory must stay writable until its
// files exist.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/file_copy.h"
#include "copy/copy_internal.h"
#include "os/error.h"
#include "os/file.h"
#include "os/syscalls.h"

namespace bufpool {
namespace copy_internal {
namespace {

// Files copied at once. Each CopyFile mostly waits in the kernel (opening,
// creating, reading a cold source), so a few in flight overlap those waits
// even on one CPU.
constexpr size_t kFileWorkers = 4;
// Files the walk may queue ahead of the workers (bounds the memory).
constexpr size_t kMaxQueuedFiles = 4096;
// Directories whose files are handed out in turn (see "Order").
constexpr size_t kOpenDirectories = 4;

// Whether files of a tree copied with `options` may take the ring: it
// writes new files in place, buffered, without fsync.
bool RingCopies(const CopyOptions& options) {
  return options.tree_ring &&
         options.replace == CopyOptions::Replace::kInPlace && !options.fsync &&
         !options.direct_io && options.method != CopyMethod::kDirect;
}

class TreeCopier final : private TreeRing::Sink {
 public:
  TreeCopier(const CopyOptions& options, TreeStats& stats,
             std::function<void(const CopyProgress&)> progress)
      : options_(options), stats_(stats), progress_(std::move(progress)) {
    link_options_ = options;
    link_options_.preserve_mode = false;  // chmod would follow the link
    start_ = absl::Now();
  }
  ~TreeCopier() override {
    ring_.reset();
    FinishFiles();
  }

  // Starts the workers; with none (thread creation refused) files are
  // copied by the walking thread.
  void StartWorkers();
  // Makes the ring for small files; without it (the reason goes to
  // TreeStats::ring_fallback) every file goes through CopyFile.
  void StartRing(BufferPool& pool, bool wanted);
  // Creates the directory `dst` for `src` (whose lstat is `st`) and queues
  // `src` to be listed by Walk; its mode and times wait for
  // FinishDirectories.
  void Directory(const std::string& src, const struct stat& st,
                 const std::string& dst);
  // Lists the queued directories and copies their entries, until none is
  // left (see "Order" at the top of this file).
  void Walk();
  // Waits for every queued file, then stops the workers.
  void FinishFiles();
  // Sets the modes and times of the directories made, deepest first.
  void FinishDirectories();

 private:
  struct PendingDirectory {
    std::string dst;
    struct stat st;
    bool created;
  };
  // A directory made, not yet listed.
  struct ToList {
    std::string src, dst;
    bool created;
  };
  // A listed directory whose regular files are being handed out.
  struct OpenDirectory {
    std::string src, dst;
    bool fresh;
    std::vector<std::string> files;
    size_t next = 0;
  };
  // An entry of a directory: `fresh` when the walk created that directory
  // (every name in it is new), `type` its readdir d_type.
  void Entry(const std::string& src, const std::string& dst, bool fresh,
             unsigned char type);
  // A regular file: to the ring when `fresh` and the ring runs, else to
  // CopyFile.
  void File(const std::string& src, const std::string& dst, bool fresh);
  void Worker();
  // Walks again what the ring handed back as no longer a regular file.
  void Revisits();
  // Calls progress_ when the last call is 100 ms old (walking thread).
  void Progress(bool force = false);
  // TreeRing::Sink.
  void FileDone(uint64_t bytes) override {
    Count(&TreeStats::files, bytes);
    Progress();
  }
  void FileFailed(const absl::Status& s) override { Report(s); }
  void Handoff(std::string src, std::string dst) override {
    QueueFile(std::move(src), std::move(dst));
  }
  void Revisit(std::string src, std::string dst) override {
    revisits_.emplace_back(std::move(src), std::move(dst));
  }
  void DirectoryMade(std::string src, const struct stat& st, std::string dst,
                     int err) override {
    --directories_in_ring_;
    Made(src, st, dst, err);
  }
  void SymlinkMade(const struct stat& st, const std::string& dst,
                   int err) override;
  // A directory's mkdir returned `err` (0: made): an existing directory is
  // merged into; then it is queued to be listed.
  void Made(const std::string& src, const struct stat& st,
            const std::string& dst, int err);
  void QueueFile(std::string src, std::string dst);
  void Symlink(const std::string& src, const struct stat& st,
               const std::string& dst);
  void Node(const struct stat& st, const std::string& dst);
  // The names in `dir` with their d_type, "." and ".." left out; false
  // (reported) on error.
  bool List(const std::string& dir,
            std::vector<std::pair<std::string, unsigned char>>& names);
  void Report(absl::string_view what, const std::string& path, int err) {
    Report(IoError(what, path, err));
  }
  // An existing destination under no_clobber: skipped silently, as cp -n
  // skips it.
  bool Clobbered(const absl::Status& s) const {
    return options_.no_clobber && absl::IsAlreadyExists(s);
  }
  void Report(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.errors.push_back(std::string(s.message()));
    if (first_error_.ok()) first_error_ = s;
  }

 public:
  // The first error reported (OK if none). Call after FinishFiles.
  absl::Status first_error() const { return first_error_; }

 private:
  void Count(uint64_t TreeStats::*counter, uint64_t bytes = 0) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++(stats_.*counter);
    stats_.bytes_copied += bytes;
  }

  const CopyOptions& options_;
  CopyOptions link_options_;
  std::mutex stats_mu_;
  TreeStats& stats_;          // guarded by stats_mu_ while workers run
  absl::Status first_error_;  // guarded by stats_mu_
  std::vector<PendingDirectory> directories_;  // walking thread only
  std::vector<ToList> to_list_;                // walking thread only
  std::deque<OpenDirectory> open_;             // walking thread only
  std::function<void(const CopyProgress&)> progress_;
  absl::Time start_;
  absl::Time last_progress_ = absl::InfinitePast();  // walking thread only
  std::unique_ptr<TreeRing> ring_;                   // walking thread only
  size_t directories_in_ring_ = 0;  // mkdirs in the ring (walking thread)
  std::vector<std::pair<std::string, std::string>> revisits_;  // walking

  std::mutex queue_mu_;
  std::condition_variable queue_ready_;  // a file queued, or closed_
  std::condition_variable queue_room_;   // a file taken
  std::deque<std::pair<std::string, std::string>> queue_;  // (src, dst)
  bool closed_ = false;
  size_t running_ = 0;                   // workers not yet returned
  std::condition_variable worker_done_;  // running_ decreased
  std::vector<std::thread> workers_;
};

void TreeCopier::StartWorkers() {
  for (size_t i = 0; i < kFileWorkers; ++i) {
    try {
      {
        std::lock_guard<std::mutex> lock(queue_mu_);
        ++running_;
      }
      workers_.emplace_back([this] { Worker(); });
    } catch (const std::system_error&) {
      std::lock_guard<std::mutex> lock(queue_mu_);
      --running_;
      break;  // fewer workers (or none: the walk copies files itself)
    }
  }
}

void TreeCopier::StartRing(BufferPool& pool, bool wanted) {
  if (!wanted) {
    stats_.ring_fallback =
        "the ring is off (tree_ring) or the options ask for what it does "
        "not do (kAtomic, O_DIRECT, fsync): CopyFile for every file";
    return;
  }
  absl::StatusOr<std::unique_ptr<TreeRing>> ring =
      TreeRing::Create(options_, pool, *this);
  if (!ring.ok()) {
    stats_.ring_fallback =
        absl::StrCat(ring.status().message(), ": CopyFile on worker threads");
    return;
  }
  ring_ = *std::move(ring);
  stats_.ring = true;
  stats_.ring_fixed_buffers = ring_->fixed();
}

void TreeCopier::Progress(bool force) {
  if (!progress_) return;
  const absl::Time now = absl::Now();
  if (!force && now - last_progress_ < absl::Milliseconds(100)) return;
  last_progress_ = now;
  CopyProgress p;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    p.bytes_done = stats_.bytes_copied;
    p.files_done = stats_.files;
  }
  p.elapsed = now - start_;
  progress_(p);
}

void TreeCopier::Revisits() {
  while (!revisits_.empty()) {
    std::pair<std::string, std::string> e = std::move(revisits_.back());
    revisits_.pop_back();
    Entry(e.first, e.second, false, DT_UNKNOWN);
  }
}

void TreeCopier::Worker() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  for (;;) {
    queue_ready_.wait(lock, [this] { return closed_ || !queue_.empty(); });
    if (queue_.empty()) {  // closed and drained
      --running_;
      worker_done_.notify_all();
      return;
    }
    std::pair<std::string, std::string> job = std::move(queue_.front());
    queue_.pop_front();
    queue_room_.notify_one();
    lock.unlock();
    absl::StatusOr<CopyStats> r = CopyFile(job.first, job.second, options_);
    if (r.ok()) {
      Count(&TreeStats::files, r->bytes_copied);
    } else if (!Clobbered(r.status())) {
      Report(r.status());
    }
    lock.lock();
  }
}

void TreeCopier::File(const std::string& src, const std::string& dst,
                      bool fresh) {
  if (ring_ != nullptr && fresh) {
    ring_->Add(src, dst);
    return Revisits();
  }
  QueueFile(src, dst);
}

void TreeCopier::QueueFile(std::string src, std::string dst) {
  if (workers_.empty()) {
    absl::StatusOr<CopyStats> r = CopyFile(src, dst, options_);
    if (!r.ok()) return Clobbered(r.status()) ? void() : Report(r.status());
    Count(&TreeStats::files, r->bytes_copied);
    return Progress();
  }
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (!queue_room_.wait_for(lock, std::chrono::milliseconds(100), [this] {
    return queue_.size() < kMaxQueuedFiles;
  })) {
    lock.unlock();
    Progress();
    lock.lock();
  }
  queue_.emplace_back(std::move(src), std::move(dst));
  queue_ready_.notify_one();
}

void TreeCopier::FinishFiles() {
  // The ring's files first: a file it hands back goes to the workers, and
  // one it hands back to be walked again may add more.
  while (ring_ != nullptr) {
    ring_->Drain();
    if (revisits_.empty() && to_list_.empty()) break;
    Revisits();
    Walk();  // a revisited or newly made directory is listed here
  }
  std::unique_lock<std::mutex> lock(queue_mu_);
  closed_ = true;
  queue_ready_.notify_all();
  while (!worker_done_.wait_for(lock, std::chrono::milliseconds(100),
                                [this] { return running_ == 0; })) {
    lock.unlock();
    Progress();
    lock.lock();
  }
  lock.unlock();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  Progress(true);
}

void TreeCopier::FinishDirectories() {
  // Deepest first (more slashes in the path), so every directory comes
  // after the ones inside it.
  std::stable_sort(directories_.begin(), directories_.end(),
                   [](const PendingDirectory& a, const PendingDirectory& b) {
                     return std::count(a.dst.begin(), a.dst.end(), '/') >
                            std::count(b.dst.begin(), b.dst.end(), '/');
                   });
  for (const PendingDirectory& d : directories_) {
    const mode_t mode = d.st.st_mode & 0777;
    if (d.created && (mode & S_IRWXU) != S_IRWXU) {
      struct stat made;
      if (os::Sys().stat(d.dst.c_str(), &made) == 0 &&
          os::Sys().chmod(d.dst.c_str(),
                          made.st_mode & 07777 & ~(S_IRWXU & ~mode)) != 0) {
        Report("set mode of", d.dst, errno);
      }
    }
    if (absl::Status s = PreserveAttributes(-1, d.dst, d.st, options_);
        !s.ok()) {
      Report(s);
    }
  }
  directories_.clear();
}

bool TreeCopier::List(
    const std::string& dir,
    std::vector<std::pair<std::string, unsigned char>>& names) {
  DIR* d = os::Sys().opendir(dir.c_str());
  if (d == nullptr) {
    Report("open directory", dir, errno);
    return false;
  }
  errno = 0;
  while (dirent* e = os::Sys().readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name, e->d_type);
    errno = 0;
  }
  const int err = errno;
  os::Sys().closedir(d);
  if (err != 0) {
    Report("read directory", dir, err);
    return false;
  }
  return true;
}

void TreeCopier::Directory(const std::string& src, const struct stat& st,
                           const std::string& dst) {
  // Created writable and searchable by its owner so the entries can be
  // made; the bits the source lacks are taken away afterwards.
  const mode_t mode = (st.st_mode & 0777) | S_IRWXU;
  if (ring_ != nullptr && ring_->Mkdir(src, st, dst, mode)) {
    ++directories_in_ring_;
    return;
  }
  const int err = os::Sys().mkdir(dst.c_str(), mode) == 0 ? 0 : errno;
  Made(src, st, dst, err);
}

void TreeCopier::Made(const std::string& src, const struct stat& st,
                      const std::string& dst, int err) {
  bool created = true;
  if (err != 0) {
    struct stat existing;
    if (err != EEXIST || os::Sys().stat(dst.c_str(), &existing) != 0 ||
        !S_ISDIR(existing.st_mode)) {
      Report("create directory", dst, err);
      return;
    }
    created = false;  // merged into, as cp does; its mode stays
  }
  Count(&TreeStats::directories);
  directories_.push_back({dst, st, created});
  to_list_.push_back({src, dst, created});
}

void TreeCopier::Walk() {
  for (;;) {
    // Nothing to list until the ring's mkdirs complete.
    if (to_list_.empty() && open_.empty() && directories_in_ring_ > 0) {
      ring_->Drain();
    }
    if (to_list_.empty() && open_.empty()) break;
    // Keep kOpenDirectories directories listed: their other entries are
    // made at once (subdirectories queued for listing), their regular files
    // kept to hand out.
    while (open_.size() < kOpenDirectories && !to_list_.empty()) {
      ToList d = std::move(to_list_.back());
      to_list_.pop_back();
      std::vector<std::pair<std::string, unsigned char>> names;
      if (!List(d.src, names)) continue;
      OpenDirectory o{d.src, d.dst, d.created, {}};
      for (auto& [name, type] : names) {
        if (type == DT_REG) {
          o.files.push_back(std::move(name));
        } else {
          Entry(absl::StrCat(d.src, "/", name), absl::StrCat(d.dst, "/", name),
                d.created, type);
        }
      }
      if (!o.files.empty()) open_.push_back(std::move(o));
    }
    // One regular file from each listed directory in turn.
    for (size_t i = 0; i < open_.size();) {
      OpenDirectory& o = open_[i];
      const std::string& name = o.files[o.next];
      Entry(absl::StrCat(o.src, "/", name), absl::StrCat(o.dst, "/", name),
            o.fresh, DT_REG);
      if (++o.next == o.files.size()) {
        open_.erase(open_.begin() + static_cast<ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
}

void TreeCopier::Entry(const std::string& src, const std::string& dst,
                       bool fresh, unsigned char type) {
  // A regular file into a new directory: the ring stats it itself.
  if (type == DT_REG && fresh && ring_ != nullptr) return File(src, dst, true);
  struct stat st;
  if (os::Sys().lstat(src.c_str(), &st) != 0) {
    Report("stat", src, errno);
    return;
  }
  if (S_ISDIR(st.st_mode)) return Directory(src, st, dst);
  if (S_ISLNK(st.st_mode)) return Symlink(src, st, dst);
  if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
    return Node(st, dst);
  }
  if (!S_ISREG(st.st_mode)) {
    return Report(absl::FailedPreconditionError(absl::StrCat(
        "skipped: ", src, ": a socket or other special file is not copied")));
  }
  // stat, not lstat: a symbolic link to a directory is refused too, as cp
  // refuses it, rather than followed to write the file inside its target.
  struct stat at;
  if (!fresh && os::Sys().stat(dst.c_str(), &at) == 0 && S_ISDIR(at.st_mode)) {
    Report("cannot overwrite directory with non-directory", dst, EISDIR);
    return;
  }
  File(src, dst, fresh);
}

void TreeCopier::Symlink(const std::string& src, const struct stat& st,
                         const std::string& dst) {
  std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
  const ssize_t n =
      os::Sys().readlink(src.c_str(), target.data(), target.size());
  if (n < 0) return Report("read symbolic link", src, errno);
  target.resize(static_cast<size_t>(n));
  if (ring_ != nullptr && ring_->Symlink(target, st, dst)) return;
  const int err =
      os::Sys().symlink(target.c_str(), dst.c_str()) == 0 ? 0 : errno;
  SymlinkMade(st, dst, err);
}

void TreeCopier::SymlinkMade(const struct stat& st, const std::string& dst,
                             int err) {
  if (err != 0) {
    if (err == EEXIST && options_.no_clobber) return;  // cp -n: skipped
    return Report("create symbolic link", dst, err);
  }
  Count(&TreeStats::symlinks);
  if (absl::Status s = PreserveAttributes(-1, dst, st, link_options_);
      !s.ok()) {
    Report(s);
  }
}

void TreeCopier::Node(const struct stat& st, const std::string& dst) {
  const mode_t type = st.st_mode & S_IFMT;
  if (os::Sys().mknod(dst.c_str(), type | (st.st_mode & 0777), st.st_rdev) !=
      0) {
    if (errno == EEXIST && options_.no_clobber) return;  // cp -n: skipped
    return Report(S_ISFIFO(st.st_mode) ? "create FIFO" : "create device node",
                  dst, errno);
  }
  Count(&TreeStats::nodes);
  if (absl::Status s = PreserveAttributes(-1, dst, st, options_); !s.ok()) {
    Report(s);
  }
}

// Refuses a destination inside the source (it would copy itself forever).
absl::Status CheckNotInside(const std::string& src, const std::string& dst) {
  char* s = os::Sys().realpath(src.c_str(), nullptr);
  if (s == nullptr) return IoError("resolve", src, errno);
  std::string real_src = s;
  free(s);
  char* d = os::Sys().realpath(DirName(dst).c_str(), nullptr);
  if (d == nullptr) return absl::OkStatus();  // mkdir will say why
  std::string real_parent = d;
  free(d);
  const std::string real_dst =
      absl::StrCat(real_parent, real_parent == "/" ? "" : "/", BaseName(dst));
  if (real_dst == real_src || real_dst.starts_with(real_src + "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot copy a directory, ", src, ", into itself, ", dst));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace copy_internal

absl::StatusOr<TreeStats> CopyTree(absl::string_view src_view,
                                   absl::string_view dst_view,
                                   const CopyOptions& options) {
  using namespace copy_internal;  // NOLINT: this layer's own internals
  const absl::Time start = absl::Now();
  std::string src(src_view);
  while (src.size() > 1 && src.back() == '/') src.pop_back();
  std::string dst(dst_view);
  struct stat st;
  if (os::Sys().stat(src.c_str(), &st) != 0) {
    return IoError("stat source", src, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return IoError("source is not a directory", src, ENOTDIR);
  }
  dst = CopyDestination(src, dst);
  while (dst.size() > 1 && dst.back() == '/') dst.pop_back();
  if (absl::Status s = CheckNotInside(src, dst); !s.ok()) return s;
  // One pool for every file, rather than one created and destroyed per
  // file: for a tree of small files that setup would cost more than the
  // copies.
  CopyOptions file_options = options;
  file_options.progress = nullptr;  // CopyFile would call it from workers
  std::unique_ptr<BufferPool> pool;
  if (options.pool == nullptr) {
    PoolOptions po;
    po.buffer_size = options.buffer_size;
    // The workers' buffers, and as many again for the ring's slots (it
    // takes half the pool at most).
    po.buffer_count = DefaultBufferCount(options) * kFileWorkers * 2;
    po.cache_size = 0;
    absl::StatusOr<std::unique_ptr<BufferPool>> p = BufferPool::Create(po);
    if (!p.ok()) return p.status();
    pool = *std::move(p);
    file_options.pool = pool.get();
  }
  TreeStats stats;
  stats.destination = dst;
  {
    TreeCopier copier(file_options, stats, options.progress);
    copier.StartWorkers();
    copier.StartRing(*file_options.pool, RingCopies(options));
    copier.Directory(src, st, dst);
    copier.Walk();
    copier.FinishFiles();
    copier.FinishDirectories();
    // The root could not be made: nothing was copied.
    if (stats.directories == 0 && !stats.errors.empty()) {
      return copier.first_error();
    }
  }
  stats.elapsed = absl::Now() - start;
  return stats;
}

}  // namespace bufpool
