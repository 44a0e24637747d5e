// Charts, reports and the live dashboard (issue 19): the SVG drawing (values, units, escaping),
// `rlhf report` on a real run's directory, the dashboard `rlhf run` serves, read over HTTP
// while the job runs, and both pages loaded in headless Chromium (Debian's `chromium`, which
// scripts/setup installs): its DOM after the page's script ran, and a screenshot whose pixels
// show the bars and the phase timeline drawn in their colours.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "report/run_report.h"
#include "report/svg.h"
#include "report/sweep_chart.h"
#include "test_paths.h"
#include "tests/support/processes.h"
#include "tests/support/run_cli.h"

namespace rlhf::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// SVG drawing.

TEST(Svg, FormatsValuesWithTheirUnits) {
  using report::format_value;
  EXPECT_EQ(format_value(0.43996861577, ""), "0.44");
  EXPECT_EQ(format_value(0.3818909525871277, "nats"), "0.3819 nats");
  EXPECT_EQ(format_value(332.06394625976714, "samples/s"), "332.1 samples/s");
  EXPECT_EQ(format_value(7497.38, "tokens/s"), "7497 tokens/s");
  EXPECT_EQ(format_value(123456.0, ""), "123.5k");
  EXPECT_EQ(format_value(1536.0, "bytes"), "1.5 KiB");
  EXPECT_EQ(format_value(432533504.0, "bytes"), "412.5 MiB");
  EXPECT_EQ(format_value(3.0 * (1ll << 30), "bytes"), "3 GiB");
  EXPECT_EQ(format_value(NAN, "s"), "-");
  // Round ticks covering the range, 1/2/5 x 10^k apart.
  EXPECT_EQ(report::nice_ticks(0.0, 0.44), (std::vector<double>{0, 0.1, 0.2, 0.3, 0.4, 0.5}));
  EXPECT_EQ(report::nice_ticks(-0.02, 0.017), (std::vector<double>{-0.02, -0.01, 0, 0.01, 0.02}));
  const auto flat = report::nice_ticks(5.0, 5.0);  // a flat series still gets an axis
  ASSERT_GE(flat.size(), 2u);
  EXPECT_LT(flat.front(), 5.0);
  EXPECT_GT(flat.back(), 5.0);
}

TEST(Svg, LineChartShowsEveryLatestValueAndEscapesNames) {
  report::LineChart c{"chart-x", "Reward <&> \"quoted\"", "nats", {}};
  c.series.push_back({"kl", {{1, 0.0}, {2, 0.125}, {3, 0.25}}, false});
  c.series.push_back({"<script>alert('x')</script>", {{1, 1.0}, {3, 2.0}}, false});
  c.series.push_back({"eval_loss (held-out)", {{2, 0.5}}, true});
  const std::string svg = report::line_chart_svg(c);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << svg;
  EXPECT_TRUE(contains(svg, "id=\"chart-x\"")) << svg;
  EXPECT_TRUE(contains(svg, ">Reward &lt;&amp;&gt; &quot;quoted&quot;</text>")) << svg;
  EXPECT_FALSE(contains(svg, "<script")) << "a series name must not become markup";
  EXPECT_TRUE(contains(svg, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;: 2 nats at step 3"))
      << svg;
  EXPECT_TRUE(contains(svg, ">kl: 0.25 nats at step 3 (first 0 nats)</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">eval_loss (held-out): 0.5 nats at step 2</text>")) << svg;
  EXPECT_EQ(count_of(svg, "<polyline class=\"series\""), 2u);
  EXPECT_EQ(count_of(svg, "<circle "), 1u) << "the held-out series is a dot";
  // Round ticks with the unit written once above the axis; the step axis in whole steps.
  for (const char* tick : {"class=\"tick y-tick\" text-anchor=\"end\" fill=\"#333\">0</text>",
                           "y-tick\" text-anchor=\"end\" fill=\"#333\">1.5</text>",
                           "class=\"unit\" text-anchor=\"end\" fill=\"#333\">nats</text>",
                           "x-tick\" text-anchor=\"middle\" fill=\"#333\">3</text>"})
    EXPECT_TRUE(contains(svg, tick)) << tick << "\n" << svg;
  report::LineChart empty{"chart-e", "Empty", "", {{"kl", {}, false}}};
  EXPECT_TRUE(contains(report::line_chart_svg(empty), "no values yet"));
}

TEST(Svg, GroupedBarsWriteEveryValueAndMarkTheMissing) {
  report::GroupedBars b{"mem",
                        "Memory",
                        "bytes",
                        {"planned total", "measured RSS"},
                        {{"actor[0] cpu:0", {192538240, 432533504}, "RSS 2.25x plan", false},
                         {"rollout[0] <gpu>", {185561728, -1}, "", true}},
                        {"from 2 steps"}};
  const std::string svg = report::grouped_bars_svg(b);
  EXPECT_TRUE(contains(svg, ">183.6 MiB  planned total</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">412.5 MiB  measured RSS</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">not reported:  measured RSS</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">rollout[0] &lt;gpu&gt;</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">warning: from 2 steps</text>")) << svg;
  EXPECT_EQ(count_of(svg, "<rect class=\"bar\""), 3u);
  EXPECT_TRUE(contains(svg, "fill=\"#e08080\"")) << "a bad group is drawn red";
  // Byte ticks at round binary figures.
  for (const char* tick : {">0 B</text>", ">100 MiB</text>", ">400 MiB</text>"})
    EXPECT_TRUE(contains(svg, tick)) << tick << "\n" << svg;
}

TEST(Svg, SweepChartsEveryRoleAndWarnsAboutFewSteps) {
  std::vector<report::SweepFigures> v(2);
  v[0].label = "n_samples_per_prompt=2";
  v[0].status = "ok";
  v[0].ran = true;
  v[0].steps = 2;
  v[0].samples_per_s = 120.5;
  v[0].memory["actor"] = {1000, 500, 510, 4000};
  v[0].memory["rollout"] = {2000, 600, -1, 3000};
  v[1].label = "n_samples_per_prompt=8";
  v[1].status = "failed";
  v[1].reason = "exit 1";
  v[1].bad = true;
  v[1].memory["actor"] = {3000, 700, -1, -1};
  const std::string svg = report::sweep_charts_svg(v);
  for (const char* id :
       {"id=\"sweep-throughput\"", "id=\"sweep-memory-actor\"", "id=\"sweep-tensor-actor\"",
        "id=\"sweep-memory-rollout\"", "id=\"sweep-tensor-rollout\""})
    EXPECT_TRUE(contains(svg, id)) << id;
  EXPECT_TRUE(contains(svg, ">120.5 samples/s</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">warning: 1 of 2 variants logged fewer than 5 steps")) << svg;
  EXPECT_TRUE(contains(svg, ">2 steps (few)</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">failed: exit 1</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">3.906 KiB  measured RSS</text>")) << svg;
  for (const char* bar : {"planned total", "measured RSS", "planned tensor", "measured tensor"})
    EXPECT_TRUE(contains(svg, "data-name=\"" + std::string(bar) + "\"")) << bar;
  // Five steps or more: no warning.
  v[0].steps = 5;
  EXPECT_FALSE(contains(report::sweep_charts_svg(v), "fewer than")) << "5 steps are enough";
}

// ---------------------------------------------------------------------------------------------
// Headless Chromium and the screenshot reader.

struct Browser {
  std::string dom;         // the DOM after the page's scripts ran
  json colours;            // png_colors.py's answer for the screenshot
  std::string screenshot;  // its path
};

// Loads `url` in headless Chromium twice: --dump-dom (scripts run for 4 s of virtual time) and
// --screenshot, then counts the pixels of `colours`. Fails the test (not skips) when chromium
// is missing: scripts/setup installs it.
Browser load_in_chromium(const std::string& url, const fs::path& dir,
                         const std::vector<std::string>& colours) {
  Browser b;
  if (std::system("command -v chromium > /dev/null 2>&1") != 0) {
    ADD_FAILURE() << "chromium is not installed: scripts/setup installs it (Debian package "
                     "`chromium`); the dashboard and report tests need a real browser";
    return b;
  }
  fs::create_directories(dir);
  // Root needs --no-sandbox; a profile of its own per call so parallel tests never share one.
  const std::string common =
      "chromium --headless --no-sandbox --disable-gpu --no-first-run "
      "--hide-scrollbars --user-data-dir='" +
      (dir / "profile").string() + "' ";
  const std::string dom = (dir / "dom.html").string();
  const std::string cmd1 = "timeout 60 " + common + "--virtual-time-budget=4000 --dump-dom '" +
                           url + "' > '" + dom + "' 2> '" + (dir / "chromium.log").string() + "'";
  EXPECT_EQ(std::system(cmd1.c_str()), 0) << cmd1 << "\n" << slurp((dir / "chromium.log").string());
  b.dom = slurp(dom);
  b.screenshot = (dir / "page.png").string();
  const std::string cmd2 = "timeout 60 " + common + "--window-size=1300,2200 --screenshot='" +
                           b.screenshot + "' '" + url + "' 2>> '" +
                           (dir / "chromium.log").string() + "'";
  EXPECT_EQ(std::system(cmd2.c_str()), 0) << cmd2;
  std::string cmd3 = std::string("'") + RLHF_PYTHON + "' '" + RLHF_SOURCE_DIR +
                     "/tests/cli/png_colors.py' '" + b.screenshot + "'";
  for (const auto& c : colours) cmd3 += " " + c;
  cmd3 += " > '" + (dir / "colours.json").string() + "'";
  EXPECT_EQ(std::system(cmd3.c_str()), 0) << cmd3;
  b.colours = json::parse(slurp((dir / "colours.json").string()), nullptr, false);
  return b;
}

// Colours of the drawing (report/svg.cpp): planned and measured bars, and the first three
// phases of the timeline (generate, score, train).
const std::vector<std::string> kColours = {"9e9e9e", "3465a4", "1f77b4", "d62728", "2ca02c"};

// Pixels of each colour in a 1300 x 2200 screenshot: a filled bar or a column of the phase
// timeline is hundreds; anti-aliased text in a colour is a few dozen at most.
void expect_drawn(const Browser& b) {
  ASSERT_TRUE(b.colours.is_object()) << "screenshot not read: " << b.screenshot;
  EXPECT_EQ(b.colours["width"], 1300);
  for (const auto& c : kColours)
    EXPECT_GT(b.colours["counts"][c].get<int>(), 500) << "colour #" << c << " in " << b.screenshot;
}

// ---------------------------------------------------------------------------------------------
// A real run: the report file, and the dashboard while the job runs.

class RunReport : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tiny_models_dir("report"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::vector<std::string> run_args(std::vector<std::string> extra) const {
    std::vector<std::string> a = {"run",   std::string(RLHF_SOURCE_DIR) + "/examples/ppo_tiny.json",
                                  "--set", "logger.run_dir=" + (dir_ / "runs").string(),
                                  "--set", "actor.model=" + (dir_ / "tiny").string(),
                                  "--set", "critic.model=" + (dir_ / "tiny-value").string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  fs::path dir_;
};

TEST_F(RunReport, ReportFileHasEveryChartAndTheRunsValues) {
  CliResult r = run_cli(run_args({"--set", "train.max_steps=3", "--set", "logger.dashboard_port=0",
                                  "--set", "logger.samples_per_step=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(contains(r.out, "dashboard at")) << "logger.dashboard_port 0 serves nothing";
  const fs::path run = dir_ / "runs" / "ppo_tiny";
  CliResult rep = run_cli({"report", run.string()});
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  EXPECT_TRUE(contains(rep.out, "3 step records")) << rep.out;
  const std::string html = slurp((run / "report.html").string());
  ASSERT_FALSE(html.empty());
  // Self-contained: no script, nothing fetched (the only URL is SVG's namespace name).
  EXPECT_FALSE(contains(html, "<script"));
  EXPECT_FALSE(contains(html, "src="));
  EXPECT_EQ(count_of(html, "http"), count_of(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  for (const char* id :
       {"chart-reward", "chart-kl", "chart-loss", "chart-length", "chart-throughput",
        "chart-phases", "chart-busy", "chart-lanes", "chart-memory-process", "chart-memory-tensor"})
    EXPECT_TRUE(contains(html, std::string("id=\"") + id + "\"")) << id;
  // The latest figures as the metrics have them, in the summary and the legends.
  const auto metrics = read_jsonl((run / "metrics.jsonl").string());
  ASSERT_EQ(metrics.size(), 3u);
  const json& last = metrics.back();
  const std::string reward = report::format_value(last["reward_mean"].get<double>(), "");
  const std::string kl = report::format_value(last["kl"].get<double>(), "nats");
  EXPECT_TRUE(contains(html, "data-key=\"reward_mean\">" + reward + "</td>")) << reward;
  EXPECT_TRUE(contains(html, ">reward_mean: " + reward + " at step 3")) << reward;
  EXPECT_TRUE(contains(html, ">kl: " + kl + " at step 3")) << kl;
  // Issue 42.4: each group's busy share of the last step, and all devices'.
  const double rollout_share =
      last["busy_s"]["rollout"].get<double>() / last["time_s"]["step"].get<double>();
  EXPECT_TRUE(contains(html, ">rollout: " + report::format_value(rollout_share, "") + " at step 3"))
      << rollout_share;
  EXPECT_TRUE(contains(
      html, ">all devices: " + report::format_value(last["devices_busy"].get<double>(), "") +
                " at step 3"));
  EXPECT_TRUE(contains(html, "<span id=\"last-step\">3</span> of 3"));
  // Issue 42.4: the lanes draw every busy interval of the 3 steps, one rect each per group.
  for (const char* role : {"actor", "critic", "ref", "rollout"}) {
    size_t intervals = 0;
    for (const auto& m : metrics) intervals += m["timeline"][role].size();
    EXPECT_GT(intervals, 0u) << role;
    EXPECT_EQ(count_of(html, std::string("class=\"busy\" data-lane=\"") + role + "\""), intervals)
        << role;
  }
  // Every role and rank with its device, planned beside measured.
  for (const auto& [role, ranks] : last["memory"].items()) {
    const json& m = ranks[0];
    const std::string label = role + "[0] " + m["device"].get<std::string>();
    EXPECT_TRUE(contains(html, "data-label=\"" + label + "\"")) << label;
    EXPECT_TRUE(
        contains(html, ">" + report::format_value(m["peak_rss_bytes"].get<double>(), "bytes") +
                           "  measured RSS</text>"))
        << role;
    EXPECT_TRUE(
        contains(html, ">" + report::format_value(m["planned_total_bytes"].get<double>(), "bytes") +
                           "  planned total</text>"))
        << role;
  }
  // Every phase of the step.
  for (const char* phase : {"generate", "score", "train", "sync"})
    EXPECT_TRUE(contains(
        html, std::string("class=\"legend\" data-name=\"") + phase + "\">" + phase + ": mean "))
        << phase;
  // The model's samples are text, escaped.
  const auto samples = read_jsonl((run / "samples.jsonl").string());
  ASSERT_EQ(samples.size(), 6u);
  EXPECT_TRUE(contains(html, "Samples of step 3"));
  EXPECT_TRUE(contains(html, report::escape(samples.back()["prompt"].get<std::string>())));

  // The same file in a browser: the elements, values and the drawn colours.
  const Browser b =
      load_in_chromium("file://" + (run / "report.html").string(), dir_ / "file", kColours);
  EXPECT_TRUE(contains(b.dom, "<span id=\"last-step\">3</span>")) << b.dom.substr(0, 2000);
  EXPECT_TRUE(contains(b.dom, ">reward_mean: " + reward + " at step 3"));
  EXPECT_EQ(count_of(b.dom, "<svg "), count_of(html, "<svg ")) << "every chart is in the DOM";
  expect_drawn(b);
}

// Multi-turn runs (issue 31): the samples table shows whole conversations, each turn with
// its role (the environment's escaped like the model's), and the tool-use chart is drawn.
TEST_F(RunReport, MultiTurnSamplesShowTheWholeConversation) {
  const fs::path run = dir_ / "tools";
  fs::create_directories(run);
  {
    std::ofstream m(run / "metrics.jsonl");
    m << R"({"step": 1, "reward_mean": 0.5, "tool_call_rate": 0.25, "turns_mean": 1.5,)"
      << R"( "masked_token_share": 0.2, "time_s": 1.0})" << '\n'
      << R"({"step": 2, "reward_mean": 0.75, "tool_call_rate": 0.75, "turns_mean": 1.75,)"
      << R"( "masked_token_share": 0.3, "time_s": 1.0})" << '\n';
    std::ofstream s(run / "samples.jsonl");
    s << json{{"step", 2},
              {"prompt", "What is 2 * 3?"},
              {"response", "The answer is 6."},
              {"reward", 1.0},
              {"conversation",
               {{{"role", "prompt"}, {"content", "What is 2 * 3?"}},
                {{"role", "assistant"}, {"content", "<tool_call>{\"expression\": \"2*3\"}"}},
                {{"role", "tool"}, {"content", "6 <b>"}},
                {{"role", "assistant"}, {"content", "The answer"}, {"truncated", true}}}}}
             .dump()
      << '\n';
  }
  CliResult ok = run_cli({"report", run.string(), "--out", (dir_ / "t.html").string()});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const std::string html = slurp((dir_ / "t.html").string());
  EXPECT_TRUE(contains(html,
                       "<div class=\"turn assistant\"><b>assistant</b>: "
                       "&lt;tool_call&gt;{&quot;expression&quot;: &quot;2*3&quot;}</div>"))
      << html;
  EXPECT_TRUE(contains(html, "<div class=\"turn tool\"><b>tool</b>: 6 &lt;b&gt;</div>"));
  EXPECT_TRUE(contains(html, "<b>assistant</b> (cut by the token budget): The answer</div>"));
  EXPECT_FALSE(contains(html, "<b>prompt</b>")) << "the prompt has its own column";
  EXPECT_TRUE(contains(html, "id=\"chart-tools\"")) << "the tool-use chart";
  EXPECT_TRUE(contains(html, ">tool_call_rate: 0.75 at step 2 (first 0.25)</text>"));
}

TEST_F(RunReport, BadRunDirectoriesAreNamedAndTextIsEscaped) {
  // A run directory written by hand: a name and texts with markup in them.
  const fs::path run = dir_ / "x<b>&y";
  fs::create_directories(run);
  {
    std::ofstream m(run / "metrics.jsonl");
    m << R"({"step": 1, "total_steps": 2, "reward_mean": 0.25, "kl": 0.5, "time_s": 1.5})" << '\n'
      << R"({"step": 2, "total_steps": 2, "reward_mean": 0.75, "kl": 0.5, "time_s": 1.25})" << '\n';
    std::ofstream s(run / "samples.jsonl");
    s << R"({"step": 2, "prompt": "</td><script>alert(1)</script>", "response": "a & b",)"
      << R"( "reward": 0.5})" << '\n';
  }
  CliResult ok = run_cli({"report", run.string(), "--out", (dir_ / "r.html").string()});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const std::string html = slurp((dir_ / "r.html").string());
  EXPECT_TRUE(contains(html, "<title>rlhf run x&lt;b&gt;&amp;y</title>")) << html.substr(0, 400);
  EXPECT_TRUE(contains(html, "<td>&lt;/td&gt;&lt;script&gt;alert(1)&lt;/script&gt;</td>"));
  EXPECT_TRUE(contains(html, "<td>a &amp; b</td>"));
  EXPECT_FALSE(contains(html, "<script"));
  EXPECT_TRUE(contains(html, ">reward_mean: 0.75 at step 2 (first 0.25)</text>"));
  EXPECT_TRUE(contains(html, "data-name=\"step\">step: mean 1.375 s, last 1.25 s</text>"))
      << "a dpo-style time_s (one number) is the step's bar";

  // Bad input: exit 2, one line naming the file and line.
  {
    std::ofstream m(run / "metrics.jsonl", std::ios::app);
    m << "{\"step\": 3,\n";
  }
  CliResult bad = run_cli({"report", run.string()});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(contains(bad.err, (run / "metrics.jsonl").string() + ":3: expected one JSON "))
      << bad.err;
  EXPECT_EQ(count_of(bad.err, "\n"), 1u) << bad.err;
  // A dashboard port already taken: refused before any worker starts, naming the key.
  const int busy = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(busy, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  CliResult taken = run_cli(run_args({"--set", "logger.dashboard_port=" + port}));
  ::close(busy);
  EXPECT_EQ(taken.exit_code, 2) << taken.out << taken.err;
  EXPECT_TRUE(contains(taken.err, "logger.dashboard_port " + port +
                                      ": cannot serve the "
                                      "dashboard on 127.0.0.1:" +
                                      port))
      << taken.err;
  EXPECT_FALSE(contains(taken.out, "loading actor")) << "no worker started";
  CliResult missing = run_cli({"report", (dir_ / "nothing").string()});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(contains(missing.err, (dir_ / "nothing").string() + ": not a directory"))
      << missing.err;
}

// A minimal HTTP/1.1 GET to 127.0.0.1:port: {status, body}; status 0 when nothing answers.
std::pair<int, std::string> http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {0, ""};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return {0, ""};
  }
  const std::string req =
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return {0, ""};
  }
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    all.append(buf, static_cast<size_t>(n));
  ::close(fd);
  std::smatch m;
  if (!std::regex_search(all, m, std::regex("^HTTP/1\\.1 (\\d{3})"))) return {0, all};
  const auto body = all.find("\r\n\r\n");
  return {std::stoi(m[1]), body == std::string::npos ? "" : all.substr(body + 4)};
}

TEST_F(RunReport, DashboardServesTheRunningJob) {
  const fs::path run = dir_ / "runs" / "ppo_tiny";
  // Long enough to still run while the checks below are made; stopped with SIGINT after them.
  rlhf::testing::RlhfProcess job(run_args({"--set", "train.max_steps=400"}), dir_.string());
  std::smatch m;
  std::string out;
  ASSERT_TRUE(rlhf::testing::poll_until(
      [&] {
        out = job.out();
        return std::regex_search(out, m, std::regex("dashboard at http://127\\.0\\.0\\.1:(\\d+)/"));
      },
      std::chrono::seconds(60)))
      << job.out() << job.err();
  const int port = std::stoi(m[1]);
  EXPECT_GT(port, 0);
  // Wait for two logged steps through the JSON endpoint.
  json metrics;
  ASSERT_TRUE(rlhf::testing::poll_until(
      [&] {
        auto [status, body] = http_get(port, "/metrics.json");
        if (status != 200) return false;
        metrics = json::parse(body, nullptr, false);
        return metrics.is_object() && metrics["steps"].size() >= 2;
      },
      std::chrono::seconds(120)))
      << job.out() << job.err();
  EXPECT_EQ(metrics["run_dir"], run.string());
  EXPECT_EQ(metrics["steps"][0]["step"], 1);
  auto [page_status, page] = http_get(port, "/");
  EXPECT_EQ(page_status, 200);
  EXPECT_TRUE(contains(page, "<h1>rlhf run ppo_tiny (live)</h1>")) << page.substr(0, 500);
  EXPECT_TRUE(contains(page, "fetch('/body'")) << "the page polls its body";
  for (const char* id : {"chart-reward", "chart-kl", "chart-loss", "chart-length", "chart-phases",
                         "chart-busy", "chart-memory-process"})
    EXPECT_TRUE(contains(page, std::string("id=\"") + id + "\"")) << id;
  auto [body_status, body] = http_get(port, "/body");
  EXPECT_EQ(body_status, 200);
  EXPECT_EQ(body.rfind("<div id=\"report-body\">", 0), 0u) << body.substr(0, 200);
  EXPECT_EQ(http_get(port, "/nothing").first, 404);

  // In a browser: the script replaced the body with a newer one (the status line says so) and
  // the charts are drawn.
  const Browser b =
      load_in_chromium("http://127.0.0.1:" + std::to_string(port) + "/", dir_ / "live", kColours);
  EXPECT_TRUE(std::regex_search(b.dom, std::regex("live: updated [^<]+ \\(\\d+ updates?\\)")))
      << b.dom.substr(0, 3000);
  std::smatch step;
  ASSERT_TRUE(std::regex_search(b.dom, step, std::regex("<span id=\"last-step\">(\\d+)</span>")));
  EXPECT_GE(std::stoi(step[1]), 2);
  EXPECT_TRUE(contains(b.dom, "id=\"chart-memory-process\""));
  EXPECT_TRUE(contains(b.dom, "measured RSS</text>"));
  expect_drawn(b);

  ASSERT_EQ(::kill(job.pid(), SIGINT), 0);
  const auto status = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value()) << "not stopped within 60 s";
  EXPECT_EQ(WEXITSTATUS(*status), 130) << job.err();
  EXPECT_EQ(http_get(port, "/").first, 0) << "the server ends with the job";
}

}  // namespace
}  // namespace rlhf::test
