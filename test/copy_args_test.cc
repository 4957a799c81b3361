// ParseCopyArgs: bufpool-copy's command line, without running the program.
#include "copy_args.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool::tools {
namespace {

// Random command lines per test: fewer in the sanitizer builds, where a
// parse costs about ten times more.
constexpr int kCommandLines = testing_util::kSanitized ? 4000 : 20000;

ParsedArgs<CopyCommand> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "bufpool-copy");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return ParseCopyArgs(static_cast<int>(args.size()), argv.data());
}

// The usage error for `args`; fails the test when they parse.
std::string UsageError(const std::vector<std::string>& args) {
  ParsedArgs<CopyCommand> r = Parse(args);
  EXPECT_EQ(r.action, ParseAction::kUsageError);
  EXPECT_EQ(r.text.find('\n'), std::string::npos) << r.text;
  EXPECT_EQ(r.text.rfind("bufpool-copy: ", 0), 0u) << r.text;
  EXPECT_TRUE(r.text.ends_with("; see 'bufpool-copy --help'")) << r.text;
  return r.text;
}

TEST(CopyArgsTest, DefaultsAreCopyOptionsDefaults) {
  ParsedArgs<CopyCommand> r = Parse({"a", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  const CopyOptions defaults;
  EXPECT_EQ(r.command.sources, std::vector<std::string>{"a"});
  EXPECT_EQ(r.command.target, "b");
  EXPECT_EQ(r.command.copy.method, defaults.method);
  EXPECT_EQ(r.command.copy.buffer_size, defaults.buffer_size);
  EXPECT_EQ(r.command.copy.batch_buffers, defaults.batch_buffers);
  EXPECT_EQ(r.command.copy.queue_depth, defaults.queue_depth);
  EXPECT_FALSE(r.command.copy.direct_io);
  EXPECT_FALSE(r.command.copy.fsync);
  EXPECT_EQ(r.command.copy.pool, nullptr);
  EXPECT_FALSE(r.command.copy.no_clobber);
  EXPECT_FALSE(r.command.verify);
  EXPECT_FALSE(r.command.json);
  EXPECT_FALSE(r.command.progress.has_value());
  EXPECT_EQ(r.command.copy.tree_ring, defaults.tree_ring);
  EXPECT_FALSE(r.command.verbose);
}

TEST(CopyArgsTest, WalkerAndVerbose) {
  ParsedArgs<CopyCommand> r =
      Parse({"--walker", "threads", "--verbose", "-r", "a", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_FALSE(r.command.copy.tree_ring);
  EXPECT_TRUE(r.command.verbose);
  r = Parse({"--walker=ring", "-r", "a", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_TRUE(r.command.copy.tree_ring);
  EXPECT_EQ(UsageError({"--walker=fast", "a", "b"}),
            "bufpool-copy: --walker: fast not in {ring,threads}; see "
            "'bufpool-copy --help'");
}

TEST(CopyArgsTest, ValueOptionsTakeBothForms) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--method=uring", "--buffer-size=65536",
                                 "--batch-buffers=8", "--queue-depth=16", "a",
                                 "b"},
        std::vector<std::string>{"--method", "uring", "--buffer-size", "65536",
                                 "--batch-buffers", "8", "--queue-depth", "16",
                                 "a", "b"}}) {
    ParsedArgs<CopyCommand> r = Parse(args);
    ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
    EXPECT_EQ(r.command.copy.method, CopyMethod::kUring);
    EXPECT_EQ(r.command.copy.buffer_size, 65536u);
    EXPECT_EQ(r.command.copy.batch_buffers, 8u);
    EXPECT_EQ(r.command.copy.queue_depth, 16u);
  }
}

TEST(CopyArgsTest, EveryMethodParses) {
  for (CopyMethod m :
       {CopyMethod::kAuto, CopyMethod::kReadWrite, CopyMethod::kDirect,
        CopyMethod::kUring, CopyMethod::kKernel}) {
    ParsedArgs<CopyCommand> r =
        Parse({"--method", std::string(CopyMethodName(m)), "a", "b"});
    ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
    EXPECT_EQ(r.command.copy.method, m);
  }
  EXPECT_NE(UsageError({"--method=fast", "a", "b"}).find("'fast'"),
            std::string::npos);
  EXPECT_NE(UsageError({"a", "b", "--method"}).find("--method"),
            std::string::npos);
}

TEST(CopyArgsTest, Flags) {
  ParsedArgs<CopyCommand> r =
      Parse({"-n", "--direct-io", "--fsync", "--verify", "--json", "a", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_TRUE(r.command.copy.no_clobber);
  EXPECT_TRUE(r.command.copy.direct_io);
  EXPECT_TRUE(r.command.copy.fsync);
  EXPECT_TRUE(r.command.verify);
  EXPECT_TRUE(r.command.json);
  r = Parse({"--no-clobber", "a", "b"});
  EXPECT_TRUE(r.command.copy.no_clobber);
}

TEST(CopyArgsTest, CpFlagsReachTheOptions) {
  ParsedArgs<CopyCommand> r = Parse({"a", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_FALSE(r.command.recursive);
  EXPECT_EQ(r.command.copy.replace, CopyOptions::Replace::kInPlace);
  EXPECT_FALSE(r.command.copy.preserve_mode);
  for (const char* flag : {"-r", "-R", "--recursive"}) {
    EXPECT_TRUE(Parse({flag, "a", "b"}).command.recursive) << flag;
  }
  EXPECT_EQ(Parse({"--atomic", "a", "b"}).command.copy.replace,
            CopyOptions::Replace::kAtomic);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"-p", "a", "b"},
        std::vector<std::string>{"--preserve=all", "a", "b"},
        std::vector<std::string>{"--preserve=mode,ownership,timestamps", "a",
                                 "b"}}) {
    r = Parse(args);
    ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
    EXPECT_TRUE(r.command.copy.preserve_mode);
    EXPECT_TRUE(r.command.copy.preserve_ownership);
    EXPECT_TRUE(r.command.copy.preserve_timestamps);
  }
  r = Parse({"--preserve=timestamps", "a", "b"});
  EXPECT_FALSE(r.command.copy.preserve_mode);
  EXPECT_TRUE(r.command.copy.preserve_timestamps);
  EXPECT_NE(UsageError({"--preserve=xattr", "a", "b"}).find("'xattr'"),
            std::string::npos);
}

TEST(CopyArgsTest, TheLastProgressFlagWins) {
  EXPECT_EQ(Parse({"--progress", "a", "b"}).command.progress, true);
  EXPECT_EQ(Parse({"--no-progress", "a", "b"}).command.progress, false);
  EXPECT_EQ(Parse({"--progress", "--no-progress", "a", "b"}).command.progress,
            false);
  EXPECT_EQ(Parse({"--no-progress", "--progress", "a", "b"}).command.progress,
            true);
}

TEST(CopyArgsTest, ARepeatedOptionTakesItsLastValue) {
  ParsedArgs<CopyCommand> r =
      Parse({"--method=uring", "--method=kernel", "a", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.copy.method, CopyMethod::kKernel);
}

TEST(CopyArgsTest, SeveralSourcesAndATarget) {
  ParsedArgs<CopyCommand> r = Parse({"a", "--fsync", "b", "c", "dir/"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.sources, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(r.command.target, "dir/");
  EXPECT_TRUE(r.command.copy.fsync);
}

TEST(CopyArgsTest, DoubleDashEndsTheOptions) {
  ParsedArgs<CopyCommand> r = Parse({"--", "-n", "--json"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.sources, std::vector<std::string>{"-n"});
  EXPECT_EQ(r.command.target, "--json");
  EXPECT_FALSE(r.command.copy.no_clobber);
  EXPECT_FALSE(r.command.json);
}

TEST(CopyArgsTest, OperandErrors) {
  EXPECT_NE(UsageError({}).find("missing SRC and DEST"), std::string::npos);
  EXPECT_NE(UsageError({"a"}).find("missing the destination operand after 'a'"),
            std::string::npos);
  for (const auto& args :
       {std::vector<std::string>{"-", "b"}, std::vector<std::string>{"a", "-"},
        std::vector<std::string>{"a", "-", "d"}}) {
    EXPECT_NE(UsageError(args).find("'-' (standard input or output) is not "
                                    "supported"),
              std::string::npos);
  }
  EXPECT_NE(UsageError({"", "b"}).find("empty path"), std::string::npos);
  // Found by test/fuzz/args_fuzz: an operand quoted in the error may hold
  // a newline or other control characters; the error stays one line.
  EXPECT_NE(UsageError({"a\nb"}).find("after 'a\\nb'"), std::string::npos);
  EXPECT_NE(UsageError({"a\rb\x7f"}).find("after 'a\\x0db\\x7f'"),
            std::string::npos);
  // Found by test/fuzz/args_fuzz: CLI11 reads a flag's "=N" with
  // std::stoll, whose out_of_range escaped as an uncaught exception.
  EXPECT_NE(UsageError({"--no-progress=99999999999999999999", "a", "b"})
                .find("a flag's value"),
            std::string::npos);
  // A file named '-' is reachable.
  EXPECT_EQ(Parse({"./-", "b"}).action, ParseAction::kRun);
}

TEST(CopyArgsTest, UnknownOptionsAreNamed) {
  EXPECT_NE(UsageError({"--bogus", "a", "b"}).find("--bogus"),
            std::string::npos);
  EXPECT_NE(UsageError({"-x", "a", "b"}).find("-x"), std::string::npos);
  EXPECT_NE(UsageError({"-nx", "a", "b"}).find("-x"), std::string::npos);
}

TEST(CopyArgsTest, BufferSizeIsAPowerOfTwoWithinThePoolsLimits) {
  EXPECT_EQ(Parse({"--buffer-size=64", "a", "b"}).command.copy.buffer_size,
            64u);
  EXPECT_EQ(Parse({"--buffer-size=4194304", "a", "b"}).command.copy.buffer_size,
            4194304u);
  for (const char* bad :
       {"32", "63", "100", "8388608", "0", "-4096", "+4096", "0x1000", "4k",
        "4096 ", "abc", "99999999999999999999999"}) {
    SCOPED_TRACE(bad);
    const std::string e =
        UsageError({std::string("--buffer-size=") + bad, "a", "b"});
    EXPECT_NE(e.find("--buffer-size"), std::string::npos) << e;
    EXPECT_NE(e.find("power of two from 64 to 4194304"), std::string::npos)
        << e;
  }
}

TEST(CopyArgsTest, CountAndDepthWithinCopyOptionsLimits) {
  for (const char* flag : {"--batch-buffers", "--queue-depth"}) {
    SCOPED_TRACE(flag);
    ParsedArgs<CopyCommand> r = Parse({flag, "4096", "a", "b"});
    ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
    EXPECT_EQ(Parse({flag, "0", "a", "b"}).action, ParseAction::kRun);
    for (const char* bad : {"4097", "-1", "1.5", "x", "18446744073709551616"}) {
      const std::string e = UsageError({flag, bad, "a", "b"});
      EXPECT_NE(e.find(flag), std::string::npos) << e;
      EXPECT_NE(e.find("0 to 4096"), std::string::npos) << e;
    }
  }
}

// --buffer-count, the name of 0.2, is still accepted for the batch with a
// one-line note for stderr, and --help says it is deprecated.
TEST(CopyArgsTest, OldBufferCountFlagIsADeprecatedAlias) {
  const std::vector<std::string> note = {
      "bufpool-copy: --buffer-count is deprecated and goes in 0.4; use "
      "--batch-buffers"};
  ParsedArgs<CopyCommand> r = Parse({"--buffer-count=8", "a", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.copy.batch_buffers, 8u);
  EXPECT_EQ(r.notes, note);
  r = Parse({"--buffer-count", "16", "a", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.copy.batch_buffers, 16u);
  EXPECT_EQ(r.notes, note);
  // Only before "--": after it, "--buffer-count" is a file name.
  r = Parse({"--batch-buffers", "16", "--", "--buffer-count", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_TRUE(r.notes.empty());
  EXPECT_NE(UsageError({"--buffer-count=4097", "a", "b"}).find("0 to 4096"),
            std::string::npos);
  const std::string help = Parse({"--help"}).text;
  EXPECT_NE(help.find("--buffer-count is its\n"), std::string::npos) << help;
  EXPECT_NE(help.find("old name, deprecated"), std::string::npos) << help;
}

TEST(CopyArgsTest, BytesPerOperationAreBounded) {
  // 1 MiB x 1024 = 1 GiB: the limit itself.
  EXPECT_EQ(
      Parse({"--buffer-size=1048576", "--batch-buffers=1024", "a", "b"}).action,
      ParseAction::kRun);
  const std::string e =
      UsageError({"--buffer-size=1048576", "--batch-buffers=2048", "a", "b"});
  EXPECT_NE(e.find("--buffer-size 1048576 x --batch-buffers 2048"),
            std::string::npos)
      << e;
  // The largest buffer with the default count is within it.
  EXPECT_EQ(Parse({"--buffer-size=4194304", "a", "b"}).action,
            ParseAction::kRun);
}

TEST(CopyArgsTest, HelpListsEveryFlagWithItsDefault) {
  for (const char* h : {"--help", "-h"}) {
    ParsedArgs<CopyCommand> r = Parse({h});
    ASSERT_EQ(r.action, ParseAction::kHelp);
    const std::string& t = r.text;
    EXPECT_EQ(t.rfind("usage: bufpool-copy [OPTIONS] SRC DEST\n", 0), 0u);
    for (const char* flag :
         {"--method METHOD", "-n, --no-clobber", "--buffer-size BYTES",
          "--batch-buffers, --buffer-count N", "--queue-depth N", "--direct-io",
          "--fsync", "--progress, --no-progress", "--verify", "--json",
          "-h, --help", "-r, -R, --recursive", "-p", "--preserve LIST",
          "--atomic"}) {
      SCOPED_TRACE(flag);
      // The flag starts a line; its description follows on the same line
      // or, for a long name, on the next.
      size_t at = t.find(std::string("\n  ") + flag + " ");
      if (at == std::string::npos) {
        at = t.find(std::string("\n  ") + flag + "\n");
      }
      ASSERT_NE(at, std::string::npos);
      if (std::string(flag) == "-h, --help") continue;
      // Its description, up to the next option, says the default.
      const size_t next = t.find("\n  -", at + 1);
      EXPECT_NE(t.substr(at, next - at).find("default"), std::string::npos)
          << t.substr(at, next - at);
    }
    for (const char* word :
         {"auto", "readwrite", "direct", "uring", "kernel", "O_DIRECT",
          "copy_file_range", "Differences from GNU cp:", "'-'", "Exit status",
          "  0  success", "  1  the work failed", "  2  usage error"}) {
      EXPECT_NE(t.find(word), std::string::npos) << word;
    }
  }
}

TEST(CopyArgsTest, AnEmptyValueIsRefusedNotTakenFromTheNextArgument) {
  EXPECT_NE(UsageError({"--method=", "uring", "a", "b"})
                .find("--method: an empty value"),
            std::string::npos);
  EXPECT_NE(UsageError({"--queue-depth=", "4", "a", "b"})
                .find("--queue-depth: an empty value"),
            std::string::npos);
  // After "--" it is an operand like any other.
  ParsedArgs<CopyCommand> r = Parse({"--", "--method=", "b"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.sources, std::vector<std::string>{"--method="});
}

TEST(CopyArgsTest, NoArgvAtAll) {
  EXPECT_EQ(ParseCopyArgs(0, nullptr).action, ParseAction::kUsageError);
  // A null entry before argc ends the arguments.
  const char* argv[] = {"bufpool-copy", "a", nullptr, nullptr};
  EXPECT_EQ(ParseCopyArgs(4, argv).text,
            "bufpool-copy: missing the destination operand after 'a'; see "
            "'bufpool-copy --help'");
}

// Random command lines from pieces of real ones (fixed seed): whatever
// parses stays within CopyOptions' limits, and nothing throws or exits.
TEST(CopyArgsTest, RandomCommandLinesStayWithinTheLimits) {
  const std::vector<std::string> pieces = {"--method",
                                           "--method=",
                                           "uring",
                                           "direct",
                                           "bogus",
                                           "--buffer-size",
                                           "--buffer-size=",
                                           "64",
                                           "4096",
                                           "65",
                                           "4194304",
                                           "8388608",
                                           "--batch-buffers",
                                           "--batch-buffers=",
                                           "--buffer-count",
                                           "--buffer-count=",
                                           "0",
                                           "4096",
                                           "4097",
                                           "--queue-depth",
                                           "--queue-depth=",
                                           "1",
                                           "-1",
                                           "-n",
                                           "--no-clobber",
                                           "--progress",
                                           "--no-progress",
                                           "--verify",
                                           "--json",
                                           "--fsync",
                                           "--direct-io",
                                           "-",
                                           "--",
                                           "a",
                                           "b",
                                           "dir/",
                                           "-h",
                                           "-x",
                                           "--=",
                                           "=",
                                           "--no-clobber=false",
                                           "-nn",
                                           "1048576",
                                           "2048",
                                           ""};
  std::mt19937 rng(15);
  int ran = 0;
  for (int i = 0; i < kCommandLines; ++i) {
    std::vector<std::string> args(rng() % 8);
    for (std::string& a : args) a = pieces[rng() % pieces.size()];
    ParsedArgs<CopyCommand> r = Parse(args);
    if (r.action == ParseAction::kUsageError) {
      EXPECT_EQ(r.text.find('\n'), std::string::npos) << r.text;
    }
    if (r.action != ParseAction::kRun) continue;
    ++ran;
    const CopyCommand& c = r.command;
    const size_t bs = c.copy.buffer_size;
    EXPECT_TRUE(bs >= 64 && bs <= kMaxToolBufferSize && (bs & (bs - 1)) == 0);
    EXPECT_LE(c.copy.batch_buffers, kMaxCopyBatchBuffers);
    EXPECT_LE(c.copy.queue_depth, kMaxCopyQueueDepth);
    EXPECT_LE(uint64_t{bs} * c.copy.batch_buffers, kMaxCopyBytesPerOperation);
    EXPECT_FALSE(c.sources.empty());
    for (const std::string& s : c.sources) EXPECT_TRUE(s != "-" && !s.empty());
    EXPECT_TRUE(c.target != "-" && !c.target.empty());
  }
  EXPECT_GT(ran, kCommandLines / 200);  // the pieces make valid ones
}

}  // namespace
}  // namespace bufpool::tools
