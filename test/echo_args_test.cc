// ParseEchoArgs and ParseEchoLoadArgs: the command lines of bufpool-echo and
// bufpool-echo-load, without running them.
#include "echo_args.h"

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "echo_load_args.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool::tools {
namespace {

// Random command lines per test: fewer in the sanitizer builds, where a
// parse costs about ten times more.
constexpr int kCommandLines = testing_util::kSanitized ? 4000 : 20000;

template <typename Command>
ParsedArgs<Command> Parse(ParsedArgs<Command> (*parse)(int, const char* const*),
                          std::vector<std::string> args) {
  args.insert(args.begin(), "tool");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return parse(static_cast<int>(args.size()), argv.data());
}

ParsedArgs<EchoCommand> Echo(const std::vector<std::string>& args) {
  return Parse(&ParseEchoArgs, args);
}
ParsedArgs<EchoLoadCommand> Load(const std::vector<std::string>& args) {
  return Parse(&ParseEchoLoadArgs, args);
}

template <typename Command>
std::string UsageError(const ParsedArgs<Command>& r, const std::string& tool) {
  EXPECT_EQ(r.action, ParseAction::kUsageError);
  EXPECT_EQ(r.text.find('\n'), std::string::npos) << r.text;
  EXPECT_EQ(r.text.rfind(tool + ": ", 0), 0u) << r.text;
  EXPECT_TRUE(r.text.ends_with("; see '" + tool + " --help'")) << r.text;
  return r.text;
}
std::string EchoError(const std::vector<std::string>& args) {
  return UsageError(Echo(args), "bufpool-echo");
}
std::string LoadError(const std::vector<std::string>& args) {
  return UsageError(Load(args), "bufpool-echo-load");
}

// Checks that `flag` is listed in `help` and that its description says the
// default (or, for --target, that it is required).
void ExpectListedWithDefault(const std::string& help, const std::string& flag) {
  SCOPED_TRACE(flag);
  // The flag starts a line; its description follows on the same line or,
  // for a long name, on the next.
  size_t at = help.find("\n  " + flag + " ");
  if (at == std::string::npos) at = help.find("\n  " + flag + "\n");
  ASSERT_NE(at, std::string::npos) << help;
  const size_t next = help.find("\n  -", at + 1);
  const std::string desc = help.substr(at, next - at);
  EXPECT_TRUE(desc.find("default") != std::string::npos ||
              desc.find("required") != std::string::npos)
      << desc;
}

TEST(EchoArgsTest, Defaults) {
  ParsedArgs<EchoCommand> r = Echo({});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  const EchoServerOptions d;
  EXPECT_EQ(r.command.server.listen, d.listen);
  EXPECT_EQ(r.command.server.engine, d.engine);
  EXPECT_EQ(r.command.server.max_unsent_bytes, d.max_unsent_bytes);
  EXPECT_EQ(r.command.server.pool, nullptr);
  EXPECT_EQ(r.command.pool.buffer_count, kDefaultEchoBuffers);
  EXPECT_EQ(r.command.pool.buffer_size, kDefaultBufferSize);
}

TEST(EchoArgsTest, ValueOptionsTakeBothForms) {
  for (const auto& args :
       {std::vector<std::string>{"--listen=0.0.0.0:7", "--engine=malloc",
                                 "--buffer-count=64", "--buffer-size=65536",
                                 "--max-unsent=1"},
        std::vector<std::string>{"--listen", "0.0.0.0:7", "--engine", "malloc",
                                 "--buffer-count", "64", "--buffer-size",
                                 "65536", "--max-unsent", "1"}}) {
    ParsedArgs<EchoCommand> r = Echo(args);
    ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
    EXPECT_EQ(r.command.server.listen, "0.0.0.0:7");
    EXPECT_EQ(r.command.server.engine, EchoEngine::kMalloc);
    EXPECT_EQ(r.command.pool.buffer_count, 64u);
    EXPECT_EQ(r.command.pool.buffer_size, 65536u);
    EXPECT_EQ(r.command.server.max_unsent_bytes, 1u);
  }
  EXPECT_EQ(Echo({"--engine=epoll"}).command.server.engine, EchoEngine::kEpoll);
  EXPECT_EQ(Echo({"--listen=localhost:0"}).command.server.listen,
            "localhost:0");
}

TEST(EchoArgsTest, WorkersMakeThePoolShared) {
  ParsedArgs<EchoCommand> r = Echo({"--workers=3"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.workers, 3u);
  EXPECT_TRUE(r.command.pool.shared);
  r = Echo({"--workers", "1"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.workers, 1u);
  r = Echo({});
  EXPECT_EQ(r.command.workers, 0u);
  EXPECT_FALSE(r.command.pool.shared);
}

TEST(EchoArgsTest, MaxBuffersMakesAnElasticPoolThatTrimsWhenIdle) {
  ParsedArgs<EchoCommand> r =
      Echo({"--buffer-count=512", "--max-buffers=262144"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.pool.buffer_count, 512u);
  EXPECT_EQ(r.command.pool.max_buffer_count, 262144u);
  EXPECT_GT(r.command.pool.trim_after_idle, absl::ZeroDuration());
  r = Echo({});
  EXPECT_EQ(r.command.pool.max_buffer_count, 0u);
  EXPECT_EQ(r.command.pool.trim_after_idle, absl::ZeroDuration());
}

TEST(EchoArgsTest, BadValuesNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {{"--engine=fast"}, "--engine: unknown engine 'fast'"},
           {{"--listen=foo"}, "--listen: 'foo'"},
           {{"--listen=127.0.0.1"}, "--listen: '127.0.0.1'"},
           {{"--listen=127.0.0.1:65536"}, "--listen: '127.0.0.1:65536'"},
           {{"--listen=127.0.0.1:-1"}, "--listen"},
           {{"--listen=::1:80"}, "--listen"},
           {{"--listen=example.com:80"}, "--listen"},
           {{"--buffer-count=0"},
            "--buffer-count: 0 is out of range (1 to 4294967294)"},
           {{"--buffer-count=4294967295"}, "--buffer-count"},
           {{"--buffer-count=lots"},
            "--buffer-count: 'lots' is not a whole number"},
           {{"--buffers=0"}, "0 is out of range (1 to 4294967294)"},
           {{"--buffer-size=100"},
            "--buffer-size: '100' is not a power of two"},
           {{"--buffer-size=32"}, "--buffer-size"},
           {{"--buffer-size=8388608"}, "--buffer-size"},
           {{"--max-unsent=0"}, "--max-unsent: 0 is out of range"},
           {{"--max-buffers=100", "--buffer-count=200"},
            "--max-buffers: 100 is below --buffer-count (200)"},
           {{"--max-buffers=4294967295"}, "--max-buffers"},
           {{"--max-unsent=-1"}, "--max-unsent"},
           {{"--frobnicate=1"}, "--frobnicate"},
           {{"extra"}, "extra"},
           {{"--listen"}, "--listen"},
           {{"--listen=", "--engine=epoll"}, "--listen: an empty value"},
           {{"--workers=0"}, "--workers: 0 is out of range (1 to 256)"},
           {{"--workers=257"}, "--workers: 257 is out of range (1 to 256)"},
           {{"--workers=two"}, "--workers: 'two' is not a whole number"},
           {{"--workers=-1"}, "--workers"},
           {{"--workers=2", "--max-buffers=8192"},
            "--workers: a shared pool is a fixed pool"},
       }) {
    SCOPED_TRACE(c.args[0]);
    const std::string e = EchoError(c.args);
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
  }
}

// --buffers, the name of 0.2, is still accepted with a one-line note for
// stderr, and --help says it is deprecated.
TEST(EchoArgsTest, OldBuffersFlagIsADeprecatedAlias) {
  const std::vector<std::string> note = {
      "bufpool-echo: --buffers is deprecated and goes in 0.4; use "
      "--buffer-count"};
  ParsedArgs<EchoCommand> r = Echo({"--buffers=64"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.pool.buffer_count, 64u);
  EXPECT_EQ(r.notes, note);
  r = Echo({"--buffers", "32"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.pool.buffer_count, 32u);
  EXPECT_EQ(r.notes, note);
  r = Echo({"--buffer-count", "32"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_TRUE(r.notes.empty());
  const std::string help = Echo({"--help"}).text;
  EXPECT_NE(help.find("--buffers is its old name, deprecated"),
            std::string::npos)
      << help;
}

TEST(EchoArgsTest, HelpListsEveryFlagWithItsDefault) {
  ParsedArgs<EchoCommand> r = Echo({"--help"});
  ASSERT_EQ(r.action, ParseAction::kHelp);
  EXPECT_EQ(r.text.rfind("usage: bufpool-echo [OPTIONS]\n", 0), 0u) << r.text;
  for (const char* flag :
       {"--listen HOST:PORT", "--engine ENGINE", "--buffer-count, --buffers N",
        "--buffer-size BYTES", "--max-unsent BYTES", "--max-buffers N",
        "--workers N"}) {
    ExpectListedWithDefault(r.text, flag);
  }
  for (const char* word :
       {"-h, --help", "uring", "epoll", "malloc", "SIGTERM", "SIGUSR1",
        "  0  success", "  1  the work failed", "a bind", "  2  usage error"}) {
    EXPECT_NE(r.text.find(word), std::string::npos) << word;
  }
  EXPECT_EQ(Echo({"-h"}).action, ParseAction::kHelp);
}

TEST(EchoLoadArgsTest, TargetIsRequiredAndChecked) {
  EXPECT_NE(LoadError({}).find("--target is required"), std::string::npos);
  for (const char* bad : {"foo", "127.0.0.1", "127.0.0.1:0", "1.2.3:80",
                          "127.0.0.1:65536", ":80", "127.0.0.1:"}) {
    SCOPED_TRACE(bad);
    EXPECT_NE(LoadError({std::string("--target=") + bad})
                  .find(std::string("--target: '") + bad + "'"),
              std::string::npos);
  }
}

TEST(EchoLoadArgsTest, DefaultsAndBothForms) {
  ParsedArgs<EchoLoadCommand> r = Load({"--target=127.0.0.1:9"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  const net::EchoLoadOptions d;
  EXPECT_EQ(r.command.load.target, "127.0.0.1:9");
  EXPECT_EQ(r.command.load.connections, kDefaultLoadConnections);
  EXPECT_EQ(r.command.load.messages, kDefaultLoadMessages);
  EXPECT_EQ(r.command.load.min_size, d.min_size);
  EXPECT_EQ(r.command.load.max_size, d.max_size);
  EXPECT_EQ(r.command.load.seed, d.seed);
  for (const auto& args :
       {std::vector<std::string>{"--target=localhost:9", "--connections=3",
                                 "--messages=5", "--size=10:20", "--seed=7"},
        std::vector<std::string>{"--target", "localhost:9", "--connections",
                                 "3", "--messages", "5", "--size", "10:20",
                                 "--seed", "7"},
        std::vector<std::string>{"--target", "localhost:9", "--connections",
                                 "3", "--messages", "5", "--size", "10", "20",
                                 "--seed", "7"}}) {
    r = Load(args);
    ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
    EXPECT_EQ(r.command.load.target, "localhost:9");
    EXPECT_EQ(r.command.load.connections, 3u);
    EXPECT_EQ(r.command.load.messages, 5u);
    EXPECT_EQ(r.command.load.min_size, 10u);
    EXPECT_EQ(r.command.load.max_size, 20u);
    EXPECT_EQ(r.command.load.seed, 7u);
  }
  r = Load({"--target=127.0.0.1:9", "--size=1:2", "--size=3:4"});
  ASSERT_EQ(r.action, ParseAction::kRun) << r.text;
  EXPECT_EQ(r.command.load.min_size, 3u);
  EXPECT_EQ(r.command.load.max_size, 4u);
}

TEST(EchoLoadArgsTest, BadValuesNameTheFlag) {
  const std::string t = "--target=127.0.0.1:9";
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {{t, "--size=5:3"}, "--size 5:3: MIN is larger than MAX"},
           {{t, "--size=0:3"}, "--size: 0 is out of range (1 to 67108864)"},
           {{t, "--size=1:67108865"}, "--size: 67108865 is out of range"},
           {{t, "--size=5"}, "--size"},
           {{t, "--size=1:2:3"}, "--size"},
           {{t, "--size=a:b"}, "--size: 'a' is not a whole number"},
           {{t, "--connections=0"}, "--connections: 0 is out of range"},
           {{t, "--connections=65537"}, "--connections"},
           {{t, "--messages=0"}, "--messages"},
           {{t, "--messages=many"}, "--messages"},
           {{t, "--seed=-1"}, "--seed"},
           {{t, "--connections=65536", "--messages=4097"},
            "--connections 65536 x --messages 4097 is over 268435456"},
           {{t, "--bogus"}, "--bogus"},
           {{t, "--size=", "1:2"}, "--size: an empty value"},
       }) {
    SCOPED_TRACE(c.args[1]);
    const std::string e = LoadError(c.args);
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
  }
  ParsedArgs<EchoLoadCommand> r =
      Load({t, "--connections=65536", "--messages=4096", "--size=1:67108864",
            "--seed=18446744073709551615"});
  EXPECT_EQ(r.action, ParseAction::kRun) << r.text;
}

TEST(EchoLoadArgsTest, HelpListsEveryFlagWithItsDefault) {
  ParsedArgs<EchoLoadCommand> r = Load({"--help"});
  ASSERT_EQ(r.action, ParseAction::kHelp);
  EXPECT_EQ(r.text.rfind("usage: bufpool-echo-load --target HOST:PORT", 0), 0u)
      << r.text;
  for (const char* flag : {"--target HOST:PORT", "--connections N",
                           "--messages M", "--size MIN:MAX", "--seed S"}) {
    ExpectListedWithDefault(r.text, flag);
  }
  for (const char* word : {"-h, --help", "  0  success", "  1  the work failed",
                           "came back wrong", "  2  usage error"}) {
    EXPECT_NE(r.text.find(word), std::string::npos) << word;
  }
}

// Random command lines from pieces of real ones (fixed seed): whatever
// parses is within the options' limits.
TEST(EchoArgsTest, RandomCommandLinesStayWithinTheLimits) {
  const std::vector<std::string> pieces = {"--listen",
                                           "--listen=",
                                           "127.0.0.1:0",
                                           "1.2.3.4:80",
                                           "x:1",
                                           "--engine",
                                           "uring",
                                           "epoll",
                                           "malloc",
                                           "bogus",
                                           "--buffer-count",
                                           "--buffer-count=",
                                           "--buffers",
                                           "--buffers=",
                                           "0",
                                           "1",
                                           "64",
                                           "4294967294",
                                           "4294967295",
                                           "--buffer-size",
                                           "--buffer-size=",
                                           "63",
                                           "4096",
                                           "4194304",
                                           "--max-unsent",
                                           "--max-unsent=",
                                           "-1",
                                           "--",
                                           "-h",
                                           "=",
                                           "",
                                           "18446744073709551615"};
  std::mt19937 rng(6);
  int ran = 0;
  for (int i = 0; i < kCommandLines; ++i) {
    std::vector<std::string> args(rng() % 7);
    for (std::string& a : args) a = pieces[rng() % pieces.size()];
    ParsedArgs<EchoCommand> r = Echo(args);
    if (r.action != ParseAction::kRun) continue;
    ++ran;
    const size_t bs = r.command.pool.buffer_size;
    EXPECT_TRUE(bs >= 64 && bs <= kMaxToolBufferSize && (bs & (bs - 1)) == 0);
    EXPECT_GE(r.command.pool.buffer_count, 1u);
    EXPECT_LE(r.command.pool.buffer_count, kMaxEchoBuffers);
    EXPECT_GE(r.command.server.max_unsent_bytes, 1u);
    EXPECT_NE(r.command.server.listen.find(':'), std::string::npos);
  }
  EXPECT_GT(ran, kCommandLines / 200);
}

TEST(EchoLoadArgsTest, RandomCommandLinesStayWithinTheLimits) {
  const std::vector<std::string> pieces = {"--target",
                                           "--target=127.0.0.1:9",
                                           "127.0.0.1:9",
                                           "127.0.0.1:0",
                                           "--connections",
                                           "--connections=",
                                           "0",
                                           "1",
                                           "65536",
                                           "65537",
                                           "--messages",
                                           "--messages=",
                                           "4096",
                                           "4097",
                                           "--size",
                                           "--size=",
                                           "1:2",
                                           "5:3",
                                           "1:67108864",
                                           "2",
                                           "--seed",
                                           "--seed=",
                                           "-1",
                                           "--",
                                           "=",
                                           ""};
  std::mt19937 rng(9);
  int ran = 0;
  for (int i = 0; i < kCommandLines; ++i) {
    std::vector<std::string> args(rng() % 9);
    for (std::string& a : args) a = pieces[rng() % pieces.size()];
    ParsedArgs<EchoLoadCommand> r = Load(args);
    if (r.action != ParseAction::kRun) continue;
    ++ran;
    const net::EchoLoadOptions& o = r.command.load;
    EXPECT_GE(o.connections, 1u);
    EXPECT_LE(o.connections, kMaxLoadConnections);
    EXPECT_GE(o.messages, 1u);
    EXPECT_LE(uint64_t{o.connections} * o.messages, kMaxLoadRoundTrips);
    EXPECT_GE(o.min_size, 1u);
    EXPECT_LE(o.min_size, o.max_size);
    EXPECT_LE(o.max_size, kMaxLoadMessageSize);
    EXPECT_NE(o.target.find(':'), std::string::npos);
  }
  EXPECT_GT(ran, kCommandLines / 400);
}

}  // namespace
}  // namespace bufpool::tools
