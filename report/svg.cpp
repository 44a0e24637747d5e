#include "report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace rlhf::report {
namespace {

constexpr int kWidth = 620;
constexpr int kLeft = 78, kRight = 16, kTop = 36, kPlotHeight = 170;
constexpr int kLegendLine = 16;
const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
const char* color(size_t i) {
  return kPalette[i % (sizeof kPalette / sizeof kPalette[0])];
}

// Pixel coordinates with one decimal: enough for a screen, short in the file.
std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string svg_open(const std::string& id, const std::string& title, int width, int height) {
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"" << escape(id)
    << "\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << ' '
    << height << "\" role=\"img\" aria-label=\"" << escape(title) << "\"><title>" << escape(title)
    << "</title><rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>"
    << "<text class=\"chart-title\" x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"bold\">"
    << escape(title) << "</text>";
  return o.str();
}

std::string text(double x, double y, const std::string& content, const std::string& attrs = "") {
  return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"11\"" +
         (attrs.empty() ? "" : " " + attrs) + ">" + escape(content) + "</text>";
}

struct Frame {                // plot area in pixels and the value ranges it shows
  double x0, x1, y0, y1;      // pixels: left, right, top, bottom
  double vx0, vx1, vy0, vy1;  // values at those edges
  double x(double v) const { return x0 + (v - vx0) / (vx1 - vx0) * (x1 - x0); }
  double y(double v) const { return y1 - (v - vy0) / (vy1 - vy0) * (y1 - y0); }
};

// Ticks for an axis in `unit`: bytes tick at round numbers of the binary unit the largest
// value is written in (0, 128 MiB, 256 MiB...), everything else at round decimal numbers.
std::vector<double> axis_ticks(double lo, double hi, const std::string& unit, int target) {
  if (unit != "bytes") return nice_ticks(lo, hi, target);
  double scale = 1;
  while (std::max(std::abs(lo), std::abs(hi)) / scale >= 1024.0 && scale < 1099511627776.0)
    scale *= 1024.0;
  std::vector<double> ticks = nice_ticks(lo / scale, hi / scale, target);
  for (double& t : ticks) t *= scale;
  return ticks;
}

// Tick labels carry the unit where it is short or changes scale (bytes); a long unit is
// written once, above the axis.
bool unit_on_ticks(const std::string& unit) {
  return unit.empty() || unit == "bytes" || unit == "s";
}

// Axes, grid lines and tick labels: the y axis in `unit`, the x axis in steps.
std::string axes(const Frame& f, const std::vector<double>& yticks, const std::string& unit,
                 const std::vector<double>& xticks) {
  std::ostringstream o;
  o << "<g class=\"axes\" stroke=\"#444\">";
  o << "<line x1=\"" << px(f.x0) << "\" y1=\"" << px(f.y0) << "\" x2=\"" << px(f.x0) << "\" y2=\""
    << px(f.y1) << "\"/><line x1=\"" << px(f.x0) << "\" y1=\"" << px(f.y1) << "\" x2=\"" << px(f.x1)
    << "\" y2=\"" << px(f.y1) << "\"/></g>";
  for (double t : yticks) {
    const double y = f.y(t);
    o << "<line x1=\"" << px(f.x0) << "\" y1=\"" << px(y) << "\" x2=\"" << px(f.x1) << "\" y2=\""
      << px(y) << "\" stroke=\"#e4e4e4\"/>"
      << text(f.x0 - 4, y + 4, format_value(t, unit_on_ticks(unit) ? unit : ""),
              "class=\"tick y-tick\" text-anchor=\"end\" fill=\"#333\"");
  }
  for (double t : xticks)
    o << text(f.x(t), f.y1 + 14, format_value(t, ""),
              "class=\"tick x-tick\" text-anchor=\"middle\" fill=\"#333\"");
  o << text(f.x1, f.y1 + 28, "step", "text-anchor=\"end\" fill=\"#333\"");
  if (!unit_on_ticks(unit))
    o << text(f.x0 - 4, f.y0 - 8, unit, "class=\"unit\" text-anchor=\"end\" fill=\"#333\"");
  return o.str();
}

std::vector<double> ticks_within(double lo, double hi, int target) {
  std::vector<double> t;
  for (double v : nice_ticks(lo, hi, target))
    if (v >= lo - 1e-9 * std::abs(hi - lo) && v <= hi + 1e-9 * std::abs(hi - lo)) t.push_back(v);
  return t;
}

// Step ticks: whole steps only.
std::vector<double> step_ticks(double lo, double hi) {
  std::vector<double> t;
  for (double v : ticks_within(lo, hi, 6))
    if (v == std::floor(v)) t.push_back(v);
  return t;
}

Frame frame_for(double xmin, double xmax, double ymin, double ymax, const std::string& unit,
                std::vector<double>& yticks) {
  if (xmax <= xmin) {
    xmin -= 1;
    xmax += 1;
  }
  yticks = axis_ticks(ymin, ymax, unit, 5);
  return Frame{kLeft, kWidth - kRight, kTop,         kTop + kPlotHeight, xmin,
               xmax,  yticks.front(),  yticks.back()};
}

}  // namespace

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format_value(double v, const std::string& unit) {
  if (!std::isfinite(v)) return "-";
  char buf[48];
  if (unit == "bytes") {
    static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double a = std::abs(v);
    while (a >= 1024.0 && u < 4) {
      a /= 1024.0;
      ++u;
    }
    std::snprintf(buf, sizeof buf, "%s%.4g %s", v < 0 ? "-" : "", a, kUnits[u]);
    return buf;
  }
  const double a = std::abs(v);
  if (a >= 1e6)
    std::snprintf(buf, sizeof buf, "%.4gM", v / 1e6);
  else if (a >= 1e4)
    std::snprintf(buf, sizeof buf, "%.4gk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return unit.empty() ? std::string(buf) : std::string(buf) + " " + unit;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0.0, 1.0};
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  std::vector<double> ticks;
  // k x step, divided by a power of ten where the step is below 1, so 3 x 0.1 is 0.3 itself.
  const double unit = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  const double inv = mag < 1 ? std::round(1 / mag) : 0.0;
  const auto at = [&](double k) { return inv > 0 ? k * unit / inv : k * unit * mag; };
  const double first = std::floor(lo / step);
  for (int i = 0; i < 100; ++i) {
    double v = at(first + i);
    if (std::abs(v) < step * 1e-9) v = 0.0;
    ticks.push_back(v);
    if (v >= hi - step * 1e-9) break;
  }
  if (ticks.size() < 2) ticks.push_back(at(first + 1));
  return ticks;
}

std::string line_chart_svg(const LineChart& c) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  size_t drawn = 0;
  for (const auto& s : c.series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymin = std::min(ymin, y);
      ymax = std::max(ymax, y);
      ++drawn;
    }
  const int height = kTop + kPlotHeight + 40 + kLegendLine * static_cast<int>(c.series.size()) + 6;
  std::ostringstream o;
  o << svg_open(c.id, c.title, kWidth, height);
  if (drawn == 0) {
    o << text(kLeft, kTop + 40, "no values yet", "class=\"empty\" fill=\"#777\"") << "</svg>";
    return o.str();
  }
  std::vector<double> yticks;
  const Frame f = frame_for(xmin, xmax, ymin, ymax, c.unit, yticks);
  o << axes(f, yticks, c.unit, step_ticks(f.vx0, f.vx1));
  double legend_y = f.y1 + 40 + 4;
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    std::vector<std::pair<double, double>> pts;
    for (const auto& p : s.points)
      if (std::isfinite(p.first) && std::isfinite(p.second)) pts.push_back(p);
    const std::string name = escape(s.name);
    if (s.markers || pts.size() == 1) {
      o << "<g class=\"series\" data-name=\"" << name << "\" fill=\"" << color(i) << "\">";
      for (const auto& [x, y] : pts)
        o << "<circle cx=\"" << px(f.x(x)) << "\" cy=\"" << px(f.y(y)) << "\" r=\"3\"/>";
      o << "</g>";
    } else if (!pts.empty()) {
      o << "<polyline class=\"series\" data-name=\"" << name << "\" fill=\"none\" stroke=\""
        << color(i) << "\" stroke-width=\"1.6\" points=\"";
      for (size_t k = 0; k < pts.size(); ++k)
        o << (k ? " " : "") << px(f.x(pts[k].first)) << ',' << px(f.y(pts[k].second));
      o << "\"/>";
    }
    o << "<rect x=\"" << kLeft << "\" y=\"" << px(legend_y - 9) << "\" width=\"12\" height=\"10\" "
      << "fill=\"" << color(i) << "\"/>";
    std::string line = s.name + ": ";
    if (pts.empty()) {
      line += "no values";
    } else {
      line += format_value(pts.back().second, c.unit) + " at step " +
              format_value(pts.back().first, "");
      if (pts.size() > 1) line += " (first " + format_value(pts.front().second, c.unit) + ")";
    }
    o << text(kLeft + 18, legend_y, line, "class=\"legend\" data-name=\"" + name + "\"");
    legend_y += kLegendLine;
  }
  o << "</svg>";
  return o.str();
}

namespace {

// The legend under stacked bars: each part's mean and last value, then the total's line.
void stacked_bars_legend(const StackedBars& c, size_t every, double legend_y,
                         std::ostringstream& o) {
  std::vector<double> sum(c.parts.size(), 0.0);
  std::vector<int> count(c.parts.size(), 0);
  for (const auto& col : c.columns)
    for (size_t p = 0; p < c.parts.size() && p < col.second.size(); ++p)
      if (std::isfinite(col.second[p]) && col.second[p] >= 0) {
        sum[p] += col.second[p];
        ++count[p];
      }
  if (every > 1) {
    o << text(kLeft, legend_y, "one column every " + std::to_string(every) + " steps",
              "class=\"note\" fill=\"#777\"");
  }
  legend_y += 16;
  for (size_t p = 0; p < c.parts.size(); ++p) {
    o << "<rect x=\"" << kLeft << "\" y=\"" << px(legend_y - 9)
      << "\" width=\"12\" height=\"10\" fill=\"" << color(p) << "\"/>";
    const double last = c.columns.back().second.size() > p ? c.columns.back().second[p] : NAN;
    o << text(kLeft + 18, legend_y,
              c.parts[p] + ": mean " +
                  (count[p] ? format_value(sum[p] / count[p], c.unit) : std::string("-")) +
                  ", last " + format_value(last, c.unit),
              "class=\"legend\" data-name=\"" + escape(c.parts[p]) + "\"");
    legend_y += kLegendLine;
  }
  if (!c.total.points.empty()) {
    o << "<line x1=\"" << kLeft << "\" y1=\"" << px(legend_y - 4) << "\" x2=\"" << kLeft + 12
      << "\" y2=\"" << px(legend_y - 4) << "\" stroke=\"#222\" stroke-dasharray=\"4 2\"/>";
    o << text(kLeft + 18, legend_y,
              c.total.name + ": last " + format_value(c.total.points.back().second, c.unit),
              "class=\"legend\" data-name=\"" + escape(c.total.name) + "\"");
  }
}

}  // namespace

std::string stacked_bars_svg(const StackedBars& c) {
  // Thin evenly to at most 300 columns: a long run keeps one column every `every` steps.
  const size_t kMaxColumns = 300;
  const size_t every = std::max<size_t>(1, (c.columns.size() + kMaxColumns - 1) / kMaxColumns);
  std::vector<const std::pair<double, std::vector<double>>*> shown;
  for (size_t i = 0; i < c.columns.size(); i += every) shown.push_back(&c.columns[i]);
  if (!c.columns.empty() && shown.back() != &c.columns.back()) shown.push_back(&c.columns.back());
  const size_t legend_rows = c.parts.size() + (c.total.points.empty() ? 0 : 1);
  const int height = kTop + kPlotHeight + 40 + kLegendLine * static_cast<int>(legend_rows) + 22;
  std::ostringstream o;
  o << svg_open(c.id, c.title, kWidth, height);
  if (shown.empty()) {
    o << text(kLeft, kTop + 40, "no values yet", "class=\"empty\" fill=\"#777\"") << "</svg>";
    return o.str();
  }
  double xmin = shown.front()->first, xmax = shown.back()->first, ymax = 0;
  for (const auto* col : shown) {
    double sum = 0;
    for (double v : col->second)
      if (std::isfinite(v) && v > 0) sum += v;
    ymax = std::max(ymax, sum);
  }
  for (const auto& [x, y] : c.total.points)
    if (std::isfinite(y)) ymax = std::max(ymax, y);
  std::vector<double> yticks;
  Frame f = frame_for(xmin - 0.5, xmax + 0.5, 0.0, ymax, c.unit, yticks);
  o << axes(f, yticks, c.unit, step_ticks(xmin, xmax));
  const double slot = (f.x1 - f.x0) / (f.vx1 - f.vx0) * static_cast<double>(every);
  const double bar = std::max(1.0, slot * 0.8);
  for (const auto* col : shown) {
    double base = 0;
    o << "<g class=\"column\" data-step=\"" << format_value(col->first, "") << "\">";
    for (size_t p = 0; p < c.parts.size() && p < col->second.size(); ++p) {
      const double v = col->second[p];
      if (!std::isfinite(v) || v <= 0) continue;
      const double top = f.y(base + v), bottom = f.y(base);
      o << "<rect class=\"part\" data-name=\"" << escape(c.parts[p]) << "\" x=\""
        << px(f.x(col->first) - bar / 2) << "\" y=\"" << px(top) << "\" width=\"" << px(bar)
        << "\" height=\"" << px(std::max(0.5, bottom - top)) << "\" fill=\"" << color(p)
        << "\"><title>step " << format_value(col->first, "") << ' ' << escape(c.parts[p]) << ' '
        << escape(format_value(v, c.unit)) << "</title></rect>";
      base += v;
    }
    o << "</g>";
  }
  if (!c.total.points.empty()) {
    o << "<polyline class=\"series\" data-name=\"" << escape(c.total.name)
      << "\" fill=\"none\" stroke=\"#222\" stroke-dasharray=\"4 2\" stroke-width=\"1.2\" "
         "points=\"";
    for (size_t k = 0; k < c.total.points.size(); ++k)
      o << (k ? " " : "") << px(f.x(c.total.points[k].first)) << ','
        << px(f.y(c.total.points[k].second));
    o << "\"/>";
  }
  stacked_bars_legend(c, every, f.y1 + 44, o);
  o << "</svg>";
  return o.str();
}

std::string lanes_svg(const Lanes& c) {
  constexpr int kLane = 22, kShare = 56;  // lane height, room for the shares
  const int height = kTop + kLane * static_cast<int>(c.lanes.size()) + 44;
  std::ostringstream o;
  o << svg_open(c.id, c.title, kWidth, height);
  double total = 0;
  for (const LaneStep& s : c.steps) total += std::max(0.0, s.seconds);
  if (c.steps.empty() || c.lanes.empty() || !(total > 0)) {
    o << text(kLeft, kTop + 40, "no values yet", "class=\"empty\" fill=\"#777\"") << "</svg>";
    return o.str();
  }
  const double x0 = kLeft, x1 = kWidth - kShare;
  auto x = [&](double t) { return x0 + (x1 - x0) * t / total; };
  const double bottom = kTop + kLane * static_cast<double>(c.lanes.size());
  std::vector<double> busy(c.lanes.size(), 0.0);
  double start = 0;
  for (const LaneStep& s : c.steps) {
    o << "<line class=\"step-start\" x1=\"" << px(x(start)) << "\" x2=\"" << px(x(start))
      << "\" y1=\"" << kTop - 4 << "\" y2=\"" << px(bottom) << "\" stroke=\"#999\" "
      << "stroke-dasharray=\"3 2\"/>"
      << text(x(start) + 2, kTop - 6, "step " + format_value(s.step, ""), "fill=\"#555\"");
    for (size_t l = 0; l < c.lanes.size() && l < s.busy.size(); ++l) {
      for (const auto& [from, to] : s.busy[l]) {
        const double a = std::clamp(from, 0.0, s.seconds), b = std::clamp(to, 0.0, s.seconds);
        if (b <= a) continue;
        busy[l] += b - a;
        o << "<rect class=\"busy\" data-lane=\"" << escape(c.lanes[l]) << "\" x=\""
          << px(x(start + a)) << "\" y=\"" << px(kTop + kLane * static_cast<double>(l) + 3)
          << "\" width=\"" << px(std::max(0.5, x(start + b) - x(start + a))) << "\" height=\""
          << kLane - 6 << "\" fill=\"" << color(l) << "\"><title>" << escape(c.lanes[l]) << " busy "
          << escape(format_value(b - a, "s")) << " (step " << format_value(s.step, "")
          << ")</title></rect>";
      }
    }
    start += std::max(0.0, s.seconds);
  }
  for (size_t l = 0; l < c.lanes.size(); ++l) {
    const double y = kTop + kLane * static_cast<double>(l) + kLane / 2.0 + 4;
    o << text(6, y, c.lanes[l]) << text(x1 + 4, y, format_value(100 * busy[l] / total, "") + "%");
  }
  o << "<line x1=\"" << px(x0) << "\" x2=\"" << px(x1) << "\" y1=\"" << px(bottom) << "\" y2=\""
    << px(bottom) << "\" stroke=\"#444\"/>";
  for (double t : nice_ticks(0, total, 6))
    o << text(x(t) - 8, bottom + 14, format_value(t, "s"), "fill=\"#555\"");
  o << "</svg>";
  return o.str();
}

std::string grouped_bars_svg(const GroupedBars& c) {
  static const char* const kBarColors[] = {"#9e9e9e", "#3465a4", "#c8c8c8", "#7aa6d6"};
  // One bar per group (throughput): green; pairs: planned grey beside measured blue.
  const bool single = c.bar_names.size() == 1;
  const auto bar_color = [single](size_t i) { return single ? "#2e8b57" : kBarColors[i % 4]; };
  size_t longest = 0;
  for (const auto& g : c.groups) longest = std::max({longest, g.label.size(), g.note.size()});
  const int label_w = std::clamp(static_cast<int>(longest) * 7 + 12, 90, 320);
  const int value_w = 150;
  const int width = std::max(kWidth, label_w + 300 + value_w);
  const int bar_h = 12, bar_gap = 2, group_gap = 12;
  const int bars = std::max<int>(1, static_cast<int>(c.bar_names.size()));
  const int group_h = std::max(bars * (bar_h + bar_gap), 30) + group_gap;
  const int top = kTop + 18 * static_cast<int>(c.warnings.size()) + 22;
  const int plot_bottom = top + group_h * static_cast<int>(c.groups.size());
  const int height = plot_bottom + 34;
  double vmax = 0;
  for (const auto& g : c.groups)
    for (double v : g.values)
      if (std::isfinite(v)) vmax = std::max(vmax, v);
  std::ostringstream o;
  o << svg_open(c.id, c.title, width, height);
  double y = kTop;
  for (const auto& w : c.warnings) {
    o << text(8, y, "warning: " + w, "class=\"warning\" fill=\"#b35900\"");
    y += 18;
  }
  double lx = label_w;
  for (size_t b = 0; b < c.bar_names.size(); ++b) {
    o << "<rect x=\"" << px(lx) << "\" y=\"" << px(y - 9) << "\" width=\"12\" height=\"10\" fill=\""
      << bar_color(b) << "\"/>" << text(lx + 16, y, c.bar_names[b], "class=\"legend\"");
    lx += 16 + 7.0 * static_cast<double>(c.bar_names[b].size()) + 16;
  }
  if (c.groups.empty()) {
    o << text(8, top + 16, "nothing to show yet", "class=\"empty\" fill=\"#777\"") << "</svg>";
    return o.str();
  }
  const std::vector<double> ticks = axis_ticks(0.0, vmax > 0 ? vmax : 1.0, c.unit, 4);
  const double x0 = label_w, x1 = width - value_w, scale_max = ticks.back();
  const auto xpos = [&](double v) { return x0 + v / scale_max * (x1 - x0); };
  for (double t : ticks) {
    o << "<line x1=\"" << px(xpos(t)) << "\" y1=\"" << top - 4 << "\" x2=\"" << px(xpos(t))
      << "\" y2=\"" << plot_bottom << "\" stroke=\"#e4e4e4\"/>"
      << text(xpos(t), plot_bottom + 14, format_value(t, unit_on_ticks(c.unit) ? c.unit : ""),
              "class=\"tick x-tick\" text-anchor=\"middle\" fill=\"#333\"");
  }
  o << "<line x1=\"" << px(x0) << "\" y1=\"" << top - 4 << "\" x2=\"" << px(x0) << "\" y2=\""
    << plot_bottom << "\" stroke=\"#444\"/>";
  if (!unit_on_ticks(c.unit))
    o << text(x1 + 24, plot_bottom + 14, c.unit, "class=\"unit\" fill=\"#333\"");
  for (size_t gi = 0; gi < c.groups.size(); ++gi) {
    const BarGroup& g = c.groups[gi];
    const double gy = top + static_cast<double>(gi) * group_h;
    o << "<g class=\"group\" data-label=\"" << escape(g.label) << "\">";
    o << text(x0 - 6, gy + 11, g.label,
              std::string("class=\"group-label\" text-anchor=\"end\" fill=\"") +
                  (g.bad ? "#cc2828" : "#222") + "\"");
    if (!g.note.empty())
      o << text(x0 - 6, gy + 24, g.note,
                std::string("class=\"note\" text-anchor=\"end\" font-style=\"italic\" fill=\"") +
                    (g.bad ? "#cc2828" : "#b35900") + "\"");
    for (size_t b = 0; b < c.bar_names.size(); ++b) {
      const double v = b < g.values.size() ? g.values[b] : -1;
      const double by = gy + static_cast<double>(b) * (bar_h + bar_gap);
      const bool has = std::isfinite(v) && v >= 0;
      const double w = has ? std::max(1.0, xpos(v) - x0) : 0.0;
      if (has)
        o << "<rect class=\"bar\" data-name=\"" << escape(c.bar_names[b]) << "\" data-value=\"" << v
          << "\" x=\"" << px(x0) << "\" y=\"" << px(by) << "\" width=\"" << px(w) << "\" height=\""
          << bar_h << "\" fill=\"" << (g.bad ? "#e08080" : bar_color(b)) << "\"/>";
      o << text(x0 + w + 4, by + 10,
                (has ? format_value(v, c.unit) : std::string("not reported:")) +
                    (c.bar_names.size() > 1 ? "  " + c.bar_names[b] : std::string()),
                "class=\"value\" fill=\"#222\"");
    }
    o << "</g>";
  }
  o << "</svg>";
  return o.str();
}

}  // namespace rlhf::report
