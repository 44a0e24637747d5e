// Sweep: grid expansion, one `rlhf run` child per variant (fork/exec, output to files in the
// variant's run directory), results read back from its metrics.jsonl, and the table outputs.
#include "sweep/sweep.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <thread>

#include "core/errors.h"
#include "core/jsonl.h"
#include "core/spec_schema.h"
#include "core/text.h"
#include "core/timing.h"
#include "engine/memory_check.h"
#include "engine/memory_plan.h"

namespace rlhf {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* variant_status_name(VariantStatus status) {
  switch (status) {
    case VariantStatus::kOk:
      return "ok";
    case VariantStatus::kFailed:
      return "failed";
    case VariantStatus::kOutOfMemory:
      return "out of memory";
    case VariantStatus::kFits:
      return "fits";
    case VariantStatus::kWouldNotFit:
      return "would not fit";
    case VariantStatus::kBadSpec:
      return "bad spec";
    case VariantStatus::kNotRun:
      return "not run";
  }
  return "?";
}

GridAxis GridAxis::parse(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw InputError("--grid " + text +
                     ": expected KEY=V1,V2,... (e.g. rollout.n_samples_per_prompt=1,2,4)");
  GridAxis axis{text.substr(0, eq), {}};
  std::string current;
  int depth = 0;
  for (char ch : text.substr(eq + 1)) {
    if (ch == '[' || ch == '{') ++depth;
    if (ch == ']' || ch == '}') --depth;
    if (ch == ',' && depth == 0) {
      axis.values.push_back(current);
      current.clear();
    } else {
      current += ch;
    }
  }
  axis.values.push_back(current);
  for (const auto& v : axis.values)
    if (v.empty()) throw InputError("--grid " + text + ": empty value");
  return axis;
}

namespace {

// "rollout.n_samples_per_prompt" + "2" -> "n_samples_per_prompt-2"; only [A-Za-z0-9._-].
std::string dir_part(const std::string& key, const std::string& value) {
  std::string s =
      key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1) + "-" + value;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '-';
  return s;
}

std::vector<VariantResult> expand(const std::vector<GridAxis>& grid) {
  std::vector<VariantResult> out(1);
  for (const auto& axis : grid) {
    std::vector<VariantResult> next;
    for (const auto& v : out) {
      for (const auto& value : axis.values) {
        VariantResult r = v;
        r.overrides.push_back(axis.key + "=" + value);
        r.values.push_back(value);
        r.name += (r.name.empty() ? "" : "_") + dir_part(axis.key, value);
        next.push_back(r);
      }
    }
    out = std::move(next);
  }
  return out;
}

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// Planned figures for one variant's spec; returns false (with reason) when a model config is
// missing.
bool fill_plan(const JobSpec& spec, VariantResult& r) {
  std::vector<std::string> missing;
  const auto models = engine::load_role_models(spec, missing);
  if (!missing.empty()) {
    r.reason = "no model config: " + missing.front();
    return false;
  }
  const engine::MemoryPlan plan = engine::plan_memory(spec, models, false);
  for (const auto& role : plan.roles) {
    r.memory[role.input.role].planned_total = role.terms.device_total();
    r.memory[role.input.role].planned_engine = role.terms.engine_peak;
    if (role.input.work == engine::RoleWork::kTrain)
      r.memory[role.input.role].planned_comm = role.collective_wire_bytes;
  }
  for (const auto& d : plan.devices) {
    r.max_planned_device = std::max(r.max_planned_device, d.total);
    if (!d.fits() && r.reason.empty())
      r.reason = d.node + ":" + std::to_string(d.device_id) + " needs " +
                 format_bytes(static_cast<double>(d.total)) + " of " +
                 format_bytes(static_cast<double>(d.capacity));
  }
  r.status = plan.fits() ? VariantStatus::kFits : VariantStatus::kWouldNotFit;
  return true;
}

void read_metrics(const std::string& path, VariantResult& r) {
  std::vector<json> records;
  if (!fs::exists(path)) return;
  read_jsonl(path, BadLinePolicy::kSkip, 0, [&](const json& rec, int64_t) {
    if (rec.contains("samples_per_s")) records.push_back(rec);
  });
  r.steps = static_cast<int64_t>(records.size());
  if (records.empty()) return;
  // The first step pays start-up (kernel selection, first allocations): leave it out when
  // there are others.
  const size_t first = records.size() > 1 ? 1 : 0;
  const double n = static_cast<double>(records.size() - first);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.devices_busy = records.back().contains("devices_busy") ? 0.0 : nan;
  r.staleness = records.back().contains("staleness") ? 0.0 : nan;
  for (size_t i = first; i < records.size(); ++i) {
    r.samples_per_s += records[i].value("samples_per_s", 0.0) / n;
    r.devices_busy += records[i].value("devices_busy", 0.0) / n;
    r.staleness += records[i].value("staleness", json::object()).value("mean", 0.0) / n;
    r.tokens_per_s += records[i].value("tokens_per_s", 0.0) / n;
    json times = records[i].value("time_s", json::object());
    if (!times.is_object()) times = {{"step", times}};  // offline jobs log the step time alone
    for (const char* phase : {"generate", "score", "train", "sync", "step"})
      if (times.contains(phase)) r.phase_s[phase] += times.value(phase, 0.0) / n;
  }
  // Offline jobs (dpo, sft, rm) have no reward: NaN prints as "-".
  r.reward_mean = records.back().value("reward_mean", std::numeric_limits<double>::quiet_NaN());
  const json peaks = engine::measured_peaks(path);
  for (const auto& [role, m] : peaks.items()) {
    RoleMemoryFigures& f = r.memory[role];
    f.measured_tensor = m.value("peak_tensor_bytes", int64_t{-1});
    f.measured_rss = m.value("peak_rss_bytes", int64_t{-1});
    r.max_measured_rss = std::max(r.max_measured_rss, f.measured_rss);
  }
}

// Starts `argv` with stdout/stderr to files; returns the pid. Throws RuntimeError.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw RuntimeError(std::string("sweep: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(127);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// Training steps logged so far in the child's metrics.jsonl (records with samples_per_s;
// held-out records are not steps), counting only a file written since `since`: an earlier
// run's file is the child's to set aside (previous-K), not the sweep's to delete.
int64_t count_steps(const std::string& path, fs::file_time_type since) {
  std::error_code ec;
  if (!fs::exists(path, ec) || fs::last_write_time(path, ec) < since || ec) return 0;
  std::ifstream in(path);
  int64_t steps = 0;
  for (std::string line; std::getline(in, line);)
    steps += line.find("\"samples_per_s\"") != std::string::npos ? 1 : 0;
  return steps;
}

void run_variant(const SweepOptions& o, VariantResult& r, const std::atomic<bool>& stop,
                 const std::string& tag, std::ostream& progress) {
  fs::create_directories(r.run_dir);
  std::vector<std::string> argv = {o.rlhf_binary, "run", o.spec_path};
  std::vector<std::string> sets = o.base_overrides;
  sets.insert(sets.end(), r.overrides.begin(), r.overrides.end());
  sets.push_back("logger.run_dir=" + o.out_dir);
  sets.push_back("name=" + r.name);
  sets.push_back("train.max_steps=" + std::to_string(o.steps));
  sets.push_back("logger.logging_steps=1");
  for (const auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  const fs::path out = fs::path(r.run_dir) / "sweep-stdout.log",
                 err = fs::path(r.run_dir) / "sweep-stderr.log";
  const std::string metrics = (fs::path(r.run_dir) / "metrics.jsonl").string();
  const auto t0 = Clock::now();
  const auto started = fs::file_time_type::clock::now();
  const pid_t pid = spawn(argv, out, err);
  int status = 0;
  bool interrupted = false;
  int64_t shown = -1;
  Clock::time_point kill_at{};
  while (true) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR)
      throw RuntimeError(std::string("sweep: waitpid failed: ") + std::strerror(errno));
    if (stop && !interrupted) {
      interrupted = true;
      ::kill(pid, SIGINT);  // `rlhf run` stops its workers and exits
      kill_at = Clock::now() + std::chrono::seconds(30);
    }
    if (interrupted && Clock::now() > kill_at) ::kill(pid, SIGKILL);
    const int64_t steps = count_steps(metrics, started);
    if (steps != shown) {
      shown = steps;
      progress << tag << " " << r.name << ": step " << steps << "/" << o.steps << " (" << std::fixed
               << std::setprecision(1) << seconds_since(t0) << " s)" << std::endl;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  r.seconds = seconds_since(t0);
  read_metrics(metrics, r);
  const std::string last = last_line(err.string());
  if (interrupted) {
    r.status = VariantStatus::kNotRun;
    r.reason = "interrupted";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    r.status = VariantStatus::kOk;
    r.reason.clear();
  } else {
    const bool oom = (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
                     last.find("bad_alloc") != std::string::npos ||
                     last.find("out of memory") != std::string::npos ||
                     last.find("signal 9") != std::string::npos;
    r.status = oom ? VariantStatus::kOutOfMemory : VariantStatus::kFailed;
    r.reason = (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                  : "signal " + std::to_string(WTERMSIG(status))) +
               (last.empty() ? "" : ": " + last);
  }
}

}  // namespace

std::vector<VariantResult> run_sweep(SweepOptions& o, const std::atomic<bool>& stop,
                                     std::ostream& progress) {
  if (o.grid.empty()) throw InputError("give at least one --grid KEY=V1,V2,...");
  if (o.steps < 1) throw InputError("--steps must be >= 1");
  const JobSpec base =
      JobSpec::load(o.spec_path, o.base_overrides);  // a bad base spec fails before anything runs
  // A typo'd grid key or a value of the wrong type would make every variant a "bad spec":
  // refuse the sweep instead, naming the key.
  for (const auto& axis : o.grid) {
    const KeySpec* key = find_key(axis.key);
    if (!key) {
      const std::string hint = closest_key(axis.key);
      throw InputError("--grid " + axis.key + ": unknown key" +
                       (hint.empty() ? "" : " (did you mean " + hint + "?)"));
    }
    for (const auto& value : axis.values) {
      const std::string problem = key->check(key->parse_override(value));
      if (!problem.empty()) throw InputError("--grid " + axis.key + "=" + value + ": " + problem);
    }
  }
  if (o.out_dir.empty())
    o.out_dir = (fs::path(base.get_string("logger.run_dir")) / ("sweep-" + base.get_string("name")))
                    .string();
  fs::create_directories(o.out_dir);
  std::vector<VariantResult> results = expand(o.grid);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < results.size(); ++i) {
    VariantResult& r = results[i];
    r.run_dir = (fs::path(o.out_dir) / r.name).string();
    const std::string tag =
        "[" + std::to_string(i + 1) + "/" + std::to_string(results.size()) + "]";
    if (stop) {
      r.reason = "interrupted";
      continue;
    }
    std::vector<std::string> sets = o.base_overrides;
    sets.insert(sets.end(), r.overrides.begin(), r.overrides.end());
    try {
      const JobSpec spec = JobSpec::load(o.spec_path, sets);
      if (!fill_plan(spec, r) && o.plan_only) r.status = VariantStatus::kBadSpec;
    } catch (const InputError& e) {
      r.status = VariantStatus::kBadSpec;
      std::string what = e.what();
      r.reason = what.substr(0, what.find('\n', what.find('\n') + 1));
      std::replace(r.reason.begin(), r.reason.end(), '\n', ' ');
      progress << tag << " " << r.name << ": bad spec: " << r.reason << std::endl;
      continue;
    }
    if (!o.plan_only) run_variant(o, r, stop, tag, progress);
    progress << tag << " " << r.name << ": " << variant_status_name(r.status);
    if (r.status == VariantStatus::kOk)
      progress << ", " << std::fixed << std::setprecision(1) << r.samples_per_s << " samples/s, "
               << r.seconds << " s";
    if (!r.reason.empty()) progress << " (" << r.reason << ")";
    progress << " | sweep " << std::fixed << std::setprecision(0) << seconds_since(t0) << " s"
             << std::endl;
  }
  write_sweep_csv(results, o.grid, (fs::path(o.out_dir) / "sweep.csv").string());
  std::ofstream md(fs::path(o.out_dir) / "sweep.md");
  md << sweep_markdown(results, o.grid);
  md.close();
  if (!md) throw RuntimeError("cannot write " + (fs::path(o.out_dir) / "sweep.md").string());
  write_sweep_report(results, o.grid, (fs::path(o.out_dir) / "report.html").string());
  return results;
}

namespace {

std::vector<std::string> roles_of(const std::vector<VariantResult>& results) {
  std::vector<std::string> roles;
  for (Role role : kAllRoles) {
    for (const auto& r : results)
      if (r.memory.count(role_name(role))) {
        roles.push_back(role_name(role));
        break;
      }
  }
  return roles;
}

std::string fixed(double v, int precision) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << v;
  return o.str();
}

std::string csv_field(std::string s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string bytes_or_dash(int64_t b) {
  return b < 0 ? "-" : format_bytes(static_cast<double>(b));
}

}  // namespace

void write_sweep_csv(const std::vector<VariantResult>& results, const std::vector<GridAxis>& grid,
                     const std::string& path) {
  std::ofstream out(path);
  const auto roles = roles_of(results);
  for (const auto& axis : grid) out << csv_field(axis.key) << ',';
  out << "variant,status,reason,steps,seconds,samples_per_s,tokens_per_s,generate_s,score_s,train_"
         "s,sync_s,step_s,reward_mean,devices_busy,staleness_mean";
  for (const auto& role : roles)
    out << ',' << role << "_planned_total," << role << "_planned_engine," << role
        << "_measured_tensor," << role << "_measured_rss," << role << "_planned_comm_per_step";
  out << '\n';
  for (const auto& r : results) {
    for (const auto& v : r.values) out << csv_field(v) << ',';
    auto phase = [&r](const char* p) {
      return r.phase_s.count(p) ? fixed(r.phase_s.at(p), 4) : std::string();
    };
    out << r.name << ',' << csv_field(variant_status_name(r.status)) << ',' << csv_field(r.reason)
        << ',' << r.steps << ',' << fixed(r.seconds, 2) << ',' << fixed(r.samples_per_s, 3) << ','
        << fixed(r.tokens_per_s, 1) << ',' << phase("generate") << ',' << phase("score") << ','
        << phase("train") << ',' << phase("sync") << ',' << phase("step") << ','
        << (std::isnan(r.reward_mean) ? std::string() : fixed(r.reward_mean, 4));
    for (double v : {r.devices_busy, r.staleness})
      out << ',' << (std::isnan(v) || r.steps == 0 ? std::string() : fixed(v, 3));
    for (const auto& role : roles) {
      RoleMemoryFigures f = r.memory.count(role) ? r.memory.at(role) : RoleMemoryFigures{};
      // Empty where nothing was planned or measured (a failed or bad-spec variant).
      for (int64_t b :
           {f.planned_total, f.planned_engine, f.measured_tensor, f.measured_rss, f.planned_comm})
        out << ',' << (b < 0 ? std::string() : std::to_string(b));
    }
    out << '\n';
  }
  out.close();
  if (!out) throw RuntimeError("cannot write " + path);
}

std::string sweep_markdown(const std::vector<VariantResult>& results,
                           const std::vector<GridAxis>& grid) {
  std::ostringstream md;
  const auto roles = roles_of(results);
  md << '|';
  for (const auto& axis : grid) md << " `" << axis.key << "` |";
  md << " status | samples/s | tokens/s | seconds per phase | reward | devices busy | staleness |";
  for (const auto& role : roles) md << ' ' << role << " planned / tensor / RSS |";
  md << "\n|";
  for (size_t i = 0; i < grid.size() + 7 + roles.size(); ++i) md << " --- |";
  md << '\n';
  for (const auto& r : results) {
    md << '|';
    for (const auto& v : r.values) md << ' ' << v << " |";
    md << ' ' << variant_status_name(r.status) << (r.reason.empty() ? "" : " (" + r.reason + ")")
       << " | ";
    if (r.steps > 0) {
      std::string phases;  // "gen 0.03 / score 0.01 / train 0.03 / sync 0.00", or "step 0.04"
      for (const auto& [key, name] : {std::pair<const char*, const char*>{"generate", "gen"},
                                      {"score", "score"},
                                      {"train", "train"},
                                      {"sync", "sync"},
                                      {"step", "step"}})
        if (r.phase_s.count(key))
          phases +=
              (phases.empty() ? "" : " / ") + std::string(name) + " " + fixed(r.phase_s.at(key), 2);
      md << fixed(r.samples_per_s, 1) << " | " << fixed(r.tokens_per_s, 0) << " | "
         << (phases.empty() ? "-" : phases) << " | "
         << (std::isnan(r.reward_mean) ? std::string("-") : fixed(r.reward_mean, 3)) << " |";
      for (double v : {r.devices_busy, r.staleness})
        md << ' ' << (std::isnan(v) ? std::string("-") : fixed(v, 2)) << " |";
    } else {
      md << "- | - | - | - | - | - |";
    }
    for (const auto& role : roles) {
      RoleMemoryFigures f = r.memory.count(role) ? r.memory.at(role) : RoleMemoryFigures{};
      md << ' ' << bytes_or_dash(f.planned_total) << " / " << bytes_or_dash(f.measured_tensor)
         << " / " << bytes_or_dash(f.measured_rss)
         << (f.planned_comm > 0 ? ", sends " + bytes_or_dash(f.planned_comm) + "/step" : "")
         << " |";
    }
    md << '\n';
  }
  md << "\nplanned: the planner's bytes per rank (everything the process holds); tensor: the "
        "largest "
        "peak_tensor_bytes the run reported (trainer-tracked tensors, or weights); RSS: the "
        "process's peak resident set; sends: the bytes one rank of a trained role sends (and "
        "receives) in its ZeRO collectives per optimizer step, as planned.\n";
  return md.str();
}

}  // namespace rlhf
