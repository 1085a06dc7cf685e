// SVG chart writer for benchmark reports; see svg_plot.h. Text is escaped once, in
// xml_escape(); every number goes through std::to_chars so the output does not depend on the
// C locale.
#include "loom/io/svg_plot.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "loom/core/error.h"
#include "loom/io/file.h"

namespace loom::io {
namespace {

constexpr double kPanelW = 480, kPanelH = 360, kTitleH = 36;  // px
// Plot area inside a panel: room for the panel title above and tick labels and axis labels
// below and to the left.
constexpr double kLeft = 64, kRight = 16, kTop = 32, kBottom = 52;
constexpr double kPlotW = kPanelW - kLeft - kRight, kPlotH = kPanelH - kTop - kBottom;
constexpr int kMaxTicks = 7;
// Matplotlib's "tab10": distinct hues that stay apart in print.
constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

std::string xml_escape(std::string_view s) {
  static constexpr std::string_view kSpecial = "&<>\"'";
  static constexpr const char* kEntity[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (size_t k = kSpecial.find(c); k != std::string_view::npos) {
      out += kEntity[k];
    } else {  // XML 1.0 allows no control characters but tab and newline
      out += (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') ? '?' : c;
    }
  }
  return out;
}

namespace {

// Tick labels: %.4g; coordinates: fixed, 0.1 px.
std::string tick_label(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v == 0 ? 0.0 : v, std::chars_format::general, 4);
  return std::string(buf, r.ptr);
}
std::string px(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 1);
  return std::string(buf, r.ptr);
}

// <line> and <text> in panel pixels; `attrs` is written as is, `content` escaped.
void line(std::ostringstream& os, double x1, double y1, double x2, double y2, std::string_view attrs) {
  os << "<line x1=\"" << px(x1) << "\" y1=\"" << px(y1) << "\" x2=\"" << px(x2) << "\" y2=\"" << px(y2) << "\" "
     << attrs << "/>\n";
}
void text(std::ostringstream& os, double x, double y, std::string_view attrs, std::string_view content) {
  os << "<text x=\"" << px(x) << "\" y=\"" << px(y) << "\" " << attrs << ">" << xml_escape(content) << "</text>\n";
}
std::string fill(const char* colour) { return std::string("fill=\"") + colour + "\""; }

// A linear axis over the padded data range, widened to its nice ticks.
struct Axis {
  double lo, hi;
  std::vector<double> ticks;
  // Maps v to [a, b] (b < a for the y axis, which grows upwards).
  double map(double v, double a, double b) const { return a + (v - lo) / (hi - lo) * (b - a); }
};

Axis make_axis(double lo, double hi) {
  if (!(lo <= hi)) lo = 0, hi = 1;  // no finite data
  // A flat (or numerically flat) range would leave nothing to divide: pad it by 10%.
  if (hi - lo <= 1e-12 * std::max(std::abs(lo), std::abs(hi))) {
    const double pad = lo != 0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad, hi += pad;
  }
  Axis a{lo, hi, nice_ticks(lo, hi, kMaxTicks)};
  a.lo = std::min(a.lo, a.ticks.front());
  a.hi = std::max(a.hi, a.ticks.back());
  return a;
}

bool finite_point(const PlotSeries& s, size_t i) { return std::isfinite(s.x[i]) && std::isfinite(s.y[i]); }

void check_series(const PlotPanel& p, const PlotSeries& s) {
  LOOM_CHECK(s.x.size() == s.y.size(), "svg", "panel '", p.title, "' series '", s.name, "': x has ", s.x.size(),
             " values but y has ", s.y.size(), "; give one y per x");
  LOOM_CHECK(s.labels.empty() || s.labels.size() == s.x.size(), "svg", "panel '", p.title, "' series '", s.name,
             "': ", s.labels.size(), " labels for ", s.x.size(), " points; give one label per point or none");
}

// The legend goes in the inside corner of the plot area with the least ink (pixels carrying
// marks, lines or text), top right on ties, so it rarely hides data.
void draw_legend(std::ostringstream& os, const std::vector<PlotSeries>& series,
                 const std::vector<std::pair<double, double>>& ink) {
  if (series.empty()) return;
  size_t longest = 0;
  for (const PlotSeries& s : series) longest = std::max(longest, s.name.size());
  const double w = 34 + 6.5 * double(longest), h = 8 + 16 * double(series.size());
  const double right = kLeft + kPlotW - w - 6, bottom = kTop + kPlotH - h - 6;
  double lx = 0, ly = 0;
  size_t least = SIZE_MAX;
  for (auto [cx, cy] : {std::pair{right, kTop + 6}, {kLeft + 6, kTop + 6}, {right, bottom}, {kLeft + 6, bottom}}) {
    const size_t n = size_t(std::count_if(ink.begin(), ink.end(), [cx = cx, cy = cy, w, h](auto q) {
      return q.first > cx - 4 && q.first < cx + w + 4 && q.second > cy - 4 && q.second < cy + h + 4;
    }));
    if (n < least) least = n, lx = cx, ly = cy;
  }
  os << "<rect class=\"legend\" x=\"" << px(lx) << "\" y=\"" << px(ly) << "\" width=\"" << px(w) << "\" height=\""
     << px(h) << "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const char* colour = kColours[k % std::size(kColours)];
    const double cy = ly + 12 + 16 * double(k);
    line(os, lx + 6, cy, lx + 24, cy, str_cat("stroke=\"", colour, "\" stroke-width=\"2\""));
    os << "<circle cx=\"" << px(lx + 15) << "\" cy=\"" << px(cy) << "\" r=\"3\" " << fill(colour) << "/>\n";
    text(os, lx + 30, cy, "dy=\"4\" font-size=\"11\"", series[k].name);
  }
}

void draw_panel(std::ostringstream& os, const PlotPanel& p, double ox, double oy) {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const PlotSeries& s : p.series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!finite_point(s, i)) continue;
      x_lo = std::min(x_lo, s.x[i]), x_hi = std::max(x_hi, s.x[i]);
      y_lo = std::min(y_lo, s.y[i]), y_hi = std::max(y_hi, s.y[i]);
    }
  }
  const bool any_point = x_lo <= x_hi;
  for (const auto& [label, y] : p.hlines) {
    if (std::isfinite(y)) y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
  }
  const Axis xa = make_axis(x_lo, x_hi), ya = make_axis(y_lo, y_hi);
  const double left = kLeft, right = kLeft + kPlotW, top = kTop, bottom = kTop + kPlotH;
  auto X = [&](double v) { return xa.map(v, left, right); };
  auto Y = [&](double v) { return ya.map(v, bottom, top); };
  // Pixels that carry ink, for draw_legend; lines and text are sampled along their length.
  std::vector<std::pair<double, double>> ink;
  auto ink_line = [&](double x0, double y0, double x1, double y1) {
    for (int t = 0; t <= 16; ++t) ink.emplace_back(x0 + (x1 - x0) * t / 16, y0 + (y1 - y0) * t / 16);
  };

  os << "<g transform=\"translate(" << px(ox) << " " << px(oy) << ")\">\n";
  text(os, kPanelW / 2, 20, "text-anchor=\"middle\" font-size=\"14\"", p.title);
  for (double t : xa.ticks) {
    line(os, X(t), top, X(t), bottom, "stroke=\"#e0e0e0\"");
    text(os, X(t), bottom + 16, "text-anchor=\"middle\" font-size=\"11\"", tick_label(t));
  }
  for (double t : ya.ticks) {
    line(os, left, Y(t), right, Y(t), "stroke=\"#e0e0e0\"");
    text(os, left - 6, Y(t), "dy=\"4\" text-anchor=\"end\" font-size=\"11\"", tick_label(t));
  }
  os << "<rect class=\"plot-area\" x=\"" << px(left) << "\" y=\"" << px(top) << "\" width=\"" << px(kPlotW)
     << "\" height=\"" << px(kPlotH) << "\" fill=\"none\" stroke=\"#333\"/>\n";
  text(os, left + kPlotW / 2, kPanelH - 10, "text-anchor=\"middle\" font-size=\"12\"", p.x_label);
  const double mid_y = top + kPlotH / 2;
  text(os, 16, mid_y,
       str_cat("transform=\"rotate(-90 16 ", px(mid_y),
               ")\" text-anchor=\"middle\""
               " font-size=\"12\""),
       p.y_label);

  for (const auto& [label, y] : p.hlines) {
    if (!std::isfinite(y)) continue;
    line(os, left, Y(y), right, Y(y), "stroke=\"#555\" stroke-dasharray=\"6 4\"");
    text(os, right - 4, Y(y) - 4, "text-anchor=\"end\" font-size=\"11\" fill=\"#555\"", label);
    ink_line(left, Y(y), right, Y(y));
    ink_line(right - 4 - 6.5 * double(label.size()), Y(y) - 8, right - 4, Y(y) - 8);
  }
  for (size_t k = 0; k < p.series.size(); ++k) {
    const PlotSeries& s = p.series[k];
    const char* colour = kColours[k % std::size(kColours)];
    std::vector<size_t> drawn;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (finite_point(s, i)) drawn.push_back(i);
    }
    if (s.line && drawn.size() >= 2) {
      os << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\" points=\"";
      for (size_t i : drawn) os << px(X(s.x[i])) << "," << px(Y(s.y[i])) << " ";
      os << "\"/>\n";
      for (size_t j = 1; j < drawn.size(); ++j) {
        const size_t a = drawn[j - 1], b = drawn[j];
        ink_line(X(s.x[a]), Y(s.y[a]), X(s.x[b]), Y(s.y[b]));
      }
    }
    for (size_t i : drawn) {
      const double cx = X(s.x[i]), cy = Y(s.y[i]);
      os << "<circle class=\"point\" cx=\"" << px(cx) << "\" cy=\"" << px(cy) << "\" r=\"3.5\" " << fill(colour)
         << "/>\n";
      ink.emplace_back(cx, cy);
      if (s.labels.empty() || s.labels[i].empty()) continue;
      text(os, cx + 5, cy - 5, "font-size=\"10\" " + fill(colour), s.labels[i]);
      ink_line(cx + 5, cy - 8, cx + 5 + 6 * double(s.labels[i].size()), cy - 8);
    }
  }
  if (!any_point) {
    text(os, left + kPlotW / 2, top + kPlotH / 2, "text-anchor=\"middle\" font-size=\"14\" fill=\"#888\"", "no data");
  }
  draw_legend(os, p.series, ink);
  os << "</g>\n";
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  LOOM_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi && std::isfinite(hi - lo), "svg",
             "nice_ticks needs a finite range lo < hi, got [", lo, ", ", hi, "]; pad a flat range first");
  LOOM_CHECK(max_ticks >= 3, "svg", "nice_ticks needs max_ticks >= 3, got ", max_ticks);
  // No step below span / (max_ticks - 1) can fit, so start in its decade and take the first
  // 1/2/5 step that does; a step as wide as the range fits in 3 ticks, so the loop ends.
  int e = int(std::floor(std::log10((hi - lo) / (max_ticks - 1))));
  for (;; ++e) {
    // Tick i is i * m * 10^e computed with one rounding, so 0.6 prints as 0.6, not 0.6000000001.
    const double scale = std::pow(10.0, std::abs(e));
    for (int m : {1, 2, 5}) {
      auto at = [&](double i) { return e >= 0 ? i * m * scale : i * m / scale; };
      const double step = at(1);
      const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
      if (last - first + 1 > max_ticks) continue;
      std::vector<double> ticks;
      for (double i = first; i <= last; ++i) ticks.push_back(at(i));
      return ticks;
    }
  }
}

std::string svg_plot(const std::string& title, const std::vector<PlotPanel>& panels) {
  for (const PlotPanel& p : panels) {
    for (const PlotSeries& s : p.series) check_series(p, s);
  }
  const double width = kPanelW * double(std::max<size_t>(1, panels.size()));
  const double height = kTitleH + kPanelH;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << px(width) << "\" height=\"" << px(height)
     << "\" viewBox=\"0 0 " << px(width) << " " << px(height)
     << "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  text(os, width / 2, 24, "text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\"", title);
  for (size_t k = 0; k < panels.size(); ++k) draw_panel(os, panels[k], kPanelW * double(k), kTitleH);
  os << "</svg>\n";
  return os.str();
}

void write_svg_plot(const std::string& path, const std::string& title, const std::vector<PlotPanel>& panels) {
  const std::string doc = svg_plot(title, panels);
  try {
    write_file_atomic(path, doc);
  } catch (const Error& e) {
    fail("svg", "cannot write plot ", path, ": ", e.what(), "; check that the directory exists and is writable");
  }
}

}  // namespace loom::io
