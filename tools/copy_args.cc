#include "copy_args.h"

#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace bufpool::tools {
namespace {

constexpr char kTool[] = "bufpool-copy";

constexpr char kUsage[] = R"(usage: bufpool-copy [OPTIONS] SRC DEST
       bufpool-copy [OPTIONS] SRC... DIR

Copies SRC to DEST, or each SRC into the directory DIR, as cp does: when the
last operand is an existing directory, SRC goes to DIR/<name of SRC>; with
more than one SRC the last operand must be a directory. An existing DEST is
written in place (its inode, mode, owner, group and hard links stay); a new
one gets SRC's mode without the set-ID and sticky bits, under the umask.
Devices and FIFOs are written, never replaced; a symbolic link is followed
(a dangling one refused). With --atomic an existing regular DEST is replaced
by a complete copy instead (a temporary file renamed over it), so a failed
copy leaves it as it was. Copying a file onto itself is refused and touches
nothing. After '--' every argument is an operand.

Differences from GNU cp:
  * '-' is refused, not read as standard input ('./-' names a file).
  * -r copies hard links as separate files (cp -R does too; no cp -a);
    sockets are reported and skipped; -n skips silently (exit 0).
  * -p never fails when ownership cannot be kept; no ACLs, xattrs,
    SELinux contexts, --reflink, --sparse, -i, -f, -u, -l, -s, -L.
  * --verify, --json, --method and the buffer flags are its own.

)";

constexpr char kMethods[] = R"(Methods (--method):
  auto        kernel for a regular file of nonzero size (copy_file_range
              keeps the bytes in the kernel), readwrite for anything else.
  readwrite   preadv/pwritev, gathering --batch-buffers pooled buffers per
              call (by default 32 of 4 KiB: 128 KiB). Works everywhere; use
              it when the others are refused.
  direct      O_DIRECT on both files, many aligned reads and writes in
              flight through io_uring: bypasses the page cache, so copying a
              huge file does not evict everything else. Use for big files on
              real disks. Falls back to buffered I/O when the file system
              refuses O_DIRECT.
  uring       io_uring with the buffer pool registered as fixed buffers,
              reads and writes overlapped. Use for fast devices with a cold
              cache; add --direct-io to bypass the page cache.
  kernel      copy_file_range (then sendfile): the kernel moves the data
              without copying it to user space, and may reflink or offload
              it on file systems that can. Falls back to readwrite across
              file systems or where it is refused.
Memory: the copy holds --batch-buffers buffers of --buffer-size bytes, times
--queue-depth for uring and direct.

)";

// What the parser fills in besides the command itself: the options whose
// text becomes a field only after parsing, and the operands.
struct RawCopyFlags {
  std::string method = "auto";
  bool atomic = false;
  bool preserve_all = false;
  std::string preserve;
  bool progress = false;
  CLI::Option* progress_flag = nullptr;
  std::string walker = "ring";
  std::vector<std::string> operands;
};

// What to copy and how the destination is written: --method, -n, -r, -p,
// --preserve, --atomic.
void AddWhatOptions(CLI::App& app, CopyCommand& c, RawCopyFlags& raw) {
  app.add_option("--method", raw.method,
                 "how to move the bytes: auto, readwrite, direct,\n"
                 "uring or kernel (see Methods below; default: auto)")
      ->type_name("METHOD")
      ->option_text("METHOD")
      ->check(CLI::Validator(
          [](std::string& name) -> std::string {
            if (ParseCopyMethod(name).has_value()) return "";
            return absl::StrCat("unknown method '", name,
                                "' (auto, readwrite, direct, uring or "
                                "kernel)");
          },
          ""));
  app.add_flag("-n,--no-clobber", c.copy.no_clobber,
               "never overwrite an existing destination: skip that\n"
               "SRC (exit 0, as cp -n does; default: overwrite)");
  app.add_flag("-r,-R,--recursive", c.recursive,
               "copy directories and everything below them\n"
               "(default: a directory SRC is skipped, exit 1)");
  app.add_flag("-p", raw.preserve_all,
               "same as --preserve=mode,ownership,timestamps\n"
               "(default: off)");
  app.add_option("--preserve", raw.preserve,
                 "keep these of SRC, comma-separated: mode,\n"
                 "ownership, timestamps, all (default: none)")
      ->type_name("LIST")
      ->option_text("LIST");
  app.add_flag("--atomic", raw.atomic,
               "replace an existing regular DEST by renaming a\n"
               "complete copy over it (default: write in place)");
}

// The buffers and the I/O: --buffer-size, --batch-buffers, --queue-depth,
// --direct-io, --fsync.
void AddIoOptions(CLI::App& app, CopyCommand& c) {
  app.add_option("--buffer-size", c.copy.buffer_size,
                 absl::StrCat("bytes per pool buffer, a power of two from 64 "
                              "to\n",
                              kMaxToolBufferSize,
                              " (default: ", kDefaultBufferSize, ")"))
      ->type_name("BYTES")
      ->option_text("BYTES")
      ->transform(PowerOfTwoIn(64, kMaxToolBufferSize));
  // --buffer-count is the name of 0.2, a deprecated alias until 0.4 (a use
  // adds a note): in the glossary a buffer count is a pool's size, as
  // bufpool-echo uses it.
  app.add_option("--batch-buffers,--buffer-count", c.copy.batch_buffers,
                 absl::StrCat("buffers gathered into one system call or "
                              "io_uring\noperation, 0 to ",
                              kMaxCopyBatchBuffers,
                              ", with buffer size x count at\nmost ",
                              kMaxCopyBytesPerOperation >> 20,
                              " MiB (default: 0, the method's: 32, or\n256 "
                              "with O_DIRECT); --buffer-count is its\n"
                              "old name, deprecated"))
      ->type_name("N")
      ->option_text("N")
      ->transform(NumberIn(0, kMaxCopyBatchBuffers));
  app.add_option("--queue-depth", c.copy.queue_depth,
                 absl::StrCat("operations in flight at once (uring, direct), "
                              "0\nto ",
                              kMaxCopyQueueDepth, " (default: 0, which is 4)"))
      ->type_name("N")
      ->option_text("N")
      ->transform(NumberIn(0, kMaxCopyQueueDepth));
  app.add_flag("--direct-io", c.copy.direct_io,
               "with --method=uring: open both files with O_DIRECT\n"
               "(default: off)");
  app.add_flag("--fsync", c.copy.fsync,
               "sync the data, and the directory after a new name\n"
               "(default: off)");
}

// What the tool reports, and the operands: --progress, --verify, --verbose,
// --json.
void AddReportOptions(CLI::App& app, CopyCommand& c, RawCopyFlags& raw) {
  raw.progress_flag =
      app.add_flag("--progress,!--no-progress", raw.progress,
                   "show progress on stderr, or never; the last one\n"
                   "given wins (default: shown when stderr is a\nterminal)");
  app.add_flag("--verify", c.verify,
               "after copying, re-read both files and compare them\n"
               "(regular destinations; a device or FIFO is not read back)\n"
               "(default: off)");
  app.add_option("--walker", raw.walker,
                 "-r: how a tree's files are copied: ring (small\n"
                 "files through one io_uring ring, where the kernel\n"
                 "has it) or threads (every file by a worker thread)\n"
                 "(default: ring)")
      ->option_text("ring|threads")
      ->check(CLI::IsMember({"ring", "threads"}));
  app.add_flag("--verbose", c.verbose,
               "say on stderr how each file or tree is copied: the\n"
               "method auto picked and why, the tree's walker\n"
               "(default: off)");
  app.add_flag("--json", c.json,
               "print each copy's statistics on stdout, one JSON\n"
               "object per line (default: off)");
  // Described in the usage paragraph; an empty group keeps it out of the
  // options list.
  app.add_option("operands", raw.operands)->group("");
}

// Sets the preserve_* fields from -p and --preserve; the error for an
// unknown attribute, or nullopt.
std::optional<std::string> ApplyPreserve(const RawCopyFlags& raw,
                                         CopyOptions& copy) {
  if (raw.preserve_all) {
    copy.preserve_mode = copy.preserve_ownership = copy.preserve_timestamps =
        true;
  }
  for (absl::string_view item :
       absl::StrSplit(raw.preserve, ',', absl::SkipEmpty())) {
    if (item == "mode" || item == "all") copy.preserve_mode = true;
    if (item == "ownership" || item == "all") copy.preserve_ownership = true;
    if (item == "timestamps" || item == "all") copy.preserve_timestamps = true;
    if (item != "mode" && item != "ownership" && item != "timestamps" &&
        item != "all") {
      return absl::StrCat("--preserve: unknown attribute '", item,
                          "' (mode, ownership, timestamps or all)");
    }
  }
  return std::nullopt;
}

// The error for operands the tool cannot take, or nullopt.
std::optional<std::string> CheckOperands(
    const std::vector<std::string>& operands) {
  if (operands.size() < 2) {
    return operands.empty()
               ? "missing SRC and DEST operands"
               : absl::StrCat("missing the destination operand after '",
                              operands[0], "'");
  }
  for (const std::string& op : operands) {
    if (op == "-") {
      return "'-' (standard input or output) is not supported: name a file "
             "(a pipe can be read as /dev/stdin; a file named '-' is ./-)";
    }
    if (op.empty()) return "an operand is an empty path";
  }
  return std::nullopt;
}

// The error for a buffer size and count whose product is over the limit of
// one operation, or nullopt.
std::optional<std::string> CheckBytesPerOperation(const CopyOptions& copy) {
  // With the default count the product stays within the limit (checked
  // at compile time below), so only an explicit --batch-buffers can pass it.
  static_assert(kMaxToolBufferSize * kLargestDefaultBatchBuffers <=
                kMaxCopyBytesPerOperation);
  if (uint64_t{copy.buffer_size} * copy.batch_buffers <=
      kMaxCopyBytesPerOperation) {
    return std::nullopt;
  }
  return absl::StrCat("--buffer-size ", copy.buffer_size, " x --batch-buffers ",
                      copy.batch_buffers, " is over ",
                      kMaxCopyBytesPerOperation >> 20,
                      " MiB per operation; lower one of them");
}

}  // namespace

ParsedArgs<CopyCommand> ParseCopyArgs(int argc, const char* const* argv) {
  ParsedArgs<CopyCommand> result;
  CopyCommand& c = result.command;
  CLI::App app;
  ConfigureApp(app, kTool, kUsage,
               absl::StrCat(kMethods,
                            ExitStatusHelp("a copy or a verification (the "
                                           "other\n     SRCs are still "
                                           "copied)"),
                            "  bufpool-copy: <what failed>: <path>: <the "
                            "system's words>\n"));
  RawCopyFlags raw;
  AddWhatOptions(app, c, raw);
  AddIoOptions(app, c);
  AddReportOptions(app, c, raw);

  result.action = RunParser(app, argc, argv, &result.text);
  if (result.action != ParseAction::kRun) return result;

  c.copy.method = *ParseCopyMethod(raw.method);  // checked by the validator
  if (raw.atomic) c.copy.replace = CopyOptions::Replace::kAtomic;
  std::optional<std::string> error = ApplyPreserve(raw, c.copy);
  if (raw.progress_flag->count() > 0) c.progress = raw.progress;
  c.copy.tree_ring = raw.walker != "threads";
  if (!error) error = CheckOperands(raw.operands);
  if (!error) error = CheckBytesPerOperation(c.copy);
  if (error) {
    result.action = ParseAction::kUsageError;
    result.text = UsageLine(kTool, *error);
    return result;
  }
  c.target = raw.operands.back();
  raw.operands.pop_back();
  c.sources = std::move(raw.operands);
  std::string note = DeprecatedNameNote(kTool, argc, argv, "--buffer-count",
                                        "--batch-buffers");
  if (!note.empty()) result.notes.push_back(std::move(note));
  return result;
}

}  // namespace bufpool::tools
