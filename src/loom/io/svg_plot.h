// A small, dependency-free SVG line/scatter chart writer for benchmark reports (`loom bench
// cascade` plots latency and center load against quality): panels side by side, nice ticks,
// legends, per-point labels. Not a general plotting library: linear axes only, no styling knobs.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::io {

struct PlotSeries {
  std::string name;                 // legend entry
  std::vector<double> x, y;         // same length; points with a non-finite x or y are skipped
  std::vector<std::string> labels;  // empty, or one short label per point drawn beside it
  bool line = true;                 // join the drawn points in the given order, besides marking them
};

struct PlotPanel {
  std::string title, x_label, y_label;
  std::vector<PlotSeries> series;                      // colours cycle after 10 series
  std::vector<std::pair<std::string, double>> hlines;  // labelled horizontal reference lines
};

// Axis ticks covering [lo, hi]: multiples of the finest "nice" step (1, 2 or 5 x 10^k) that
// needs at most max_ticks of them, from the last multiple <= lo to the first >= hi (up to
// rounding). Requires finite lo < hi and max_ticks >= 3 (a range straddling 0 needs 3).
// E.g. [0, 1], 6 -> 0, 0.2, ..., 1; [3, 97], 6 -> 0, 20, ..., 100; [3, 97], 5 -> 0, 50, 100.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks);

// One standalone SVG document (root <svg> with xmlns, viewBox, width, height) with the panels
// side by side, each 480x360 px under a title band. Axis ranges span the nice ticks of the finite
// data and reference lines; a flat range or a single point is padded; a panel with no finite
// points draws its axes and says "no data". Each panel's legend sits in the inside corner of
// the plot area that covers the least data. All text is XML-escaped. Throws "[svg] ..." when a
// series' x, y and labels differ in length.
// s for XML/HTML text and attribute values: & < > " ' as entities, control characters other
// than tab and newline (which XML 1.0 forbids) as '?'.
std::string xml_escape(std::string_view s);

std::string svg_plot(const std::string& title, const std::vector<PlotPanel>& panels);

// svg_plot written atomically to `path`; throws "[svg] cannot write plot <path>: ..." on failure.
void write_svg_plot(const std::string& path, const std::string& title, const std::vector<PlotPanel>& panels);

}  // namespace loom::io
