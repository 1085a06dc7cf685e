// SVG chart writer: well-formed documents, escaped text, nice ticks that cover their range,
// points inside the plot area, flat/empty/NaN data, and errors that name the path or series.
#include "loom/io/svg_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/io/file.h"

using namespace loom;
using namespace loom::io;

namespace {

// A tiny XML checker, enough for what svg_plot writes: tags balance and nest, there is exactly
// one root element, attribute quotes pair up, and every '&' starts a known entity. Returns the
// root element's name, or "" when the document is not well-formed.
std::string well_formed_root(const std::string& doc) {
  static const std::regex entity("^&(amp|lt|gt|quot|apos);");
  std::vector<std::string> open;
  std::string root;
  size_t pos = 0;
  while (pos < doc.size()) {
    if (doc[pos] == '&') {
      if (!std::regex_search(doc.begin() + long(pos), doc.end(), entity)) return "";
      ++pos;
      continue;
    }
    if (doc[pos] == '>') return "";  // we always escape '>' in text
    if (doc[pos] != '<') {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(doc[pos]))) return "";
      ++pos;
      continue;
    }
    const size_t end = doc.find('>', pos);
    if (end == std::string::npos) return "";
    const std::string tag = doc.substr(pos + 1, end - pos - 1);
    pos = end + 1;
    if (tag.empty() || std::count(tag.begin(), tag.end(), '"') % 2 != 0) return "";
    if (tag.find('<') != std::string::npos) return "";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "";
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0]))) return "";
    if (open.empty()) {
      if (!root.empty()) return "";  // a second root
      root = name;
    }
    if (tag.back() != '/') open.push_back(name);
  }
  return open.empty() ? root : "";
}

struct Rect {
  double x, y, w, h;
};
Rect plot_area(const std::string& doc) {
  static const std::regex re(
      "class=\"plot-area\" x=\"([-0-9.]+)\" y=\"([-0-9.]+)\" width=\"([-0-9.]+)\" "
      "height=\"([-0-9.]+)\"");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(doc, m, re)) << doc;
  if (m.empty()) return {0, 0, 0, 0};
  return {std::stod(m[1]), std::stod(m[2]), std::stod(m[3]), std::stod(m[4])};
}
std::vector<std::pair<double, double>> points(const std::string& doc) {
  static const std::regex re("class=\"point\" cx=\"([-0-9.]+)\" cy=\"([-0-9.]+)\"");
  std::vector<std::pair<double, double>> out;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), re); it != std::sregex_iterator(); ++it) {
    out.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]));
  }
  return out;
}
void expect_points_inside(const std::string& doc) {
  const Rect r = plot_area(doc);
  ASSERT_GT(r.w, 0);
  ASSERT_GT(r.h, 0);
  for (auto [cx, cy] : points(doc)) {
    EXPECT_GE(cx, r.x);
    EXPECT_LE(cx, r.x + r.w);
    EXPECT_GE(cy, r.y);
    EXPECT_LE(cy, r.y + r.h);
  }
}

PlotPanel cascade_panel() {
  PlotPanel p{"latency vs quality", "quality (accuracy)", "latency (ms)", {}, {}};
  p.series.push_back(
      {"cascade", {0.61, 0.7, 0.78, 0.83}, {4.1, 6.5, 9.0, 14.2}, {"T=0.2", "T=0.4", "T=0.6", "T=0.8"}, true});
  p.series.push_back({"edge only", {0.6}, {3.9}, {}, false});
  p.hlines = {{"center only", 15.0}};
  return p;
}

}  // namespace

TEST(SvgPlot, CheckerRejectsBrokenDocuments) {
  EXPECT_EQ(well_formed_root("<svg><g></g><rect/></svg>"), "svg");
  EXPECT_EQ(well_formed_root("<svg><g></svg>"), "");
  EXPECT_EQ(well_formed_root("<svg></svg><svg></svg>"), "");
  EXPECT_EQ(well_formed_root("<svg><text>a<b</text></svg>"), "");
  EXPECT_EQ(well_formed_root("<svg><text>a&b</text></svg>"), "");
  EXPECT_EQ(well_formed_root("<svg x=\"1></svg>"), "");
}

TEST(SvgPlot, DocumentIsWellFormedWithOneSvgRoot) {
  PlotPanel load = cascade_panel();
  load.title = "center load vs quality";
  const std::string doc = svg_plot("cascade sweep", {cascade_panel(), load});
  EXPECT_EQ(well_formed_root(doc), "svg") << doc;
  EXPECT_EQ(doc.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(doc.find("viewBox=\"0 0 960.0 396.0\""), std::string::npos) << doc.substr(0, 200);
  EXPECT_NE(doc.find("width=\"960.0\""), std::string::npos);
  EXPECT_NE(doc.find("height=\"396.0\""), std::string::npos);
  EXPECT_NE(doc.find("center load vs quality"), std::string::npos);
  EXPECT_NE(doc.find(">center only<"), std::string::npos);  // the reference line's label
  EXPECT_NE(doc.find(">edge only<"), std::string::npos);    // a legend entry
  EXPECT_EQ(points(doc).size(), 10u);
  // Distinct colours for the two series of a panel.
  EXPECT_NE(doc.find("fill=\"#1f77b4\""), std::string::npos);
  EXPECT_NE(doc.find("fill=\"#d62728\""), std::string::npos);
}

TEST(SvgPlot, EscapesAllText) {
  const std::string nasty = "a<&>\"b";
  PlotPanel p{nasty, nasty, nasty, {{nasty, {1, 2}, {3, 4}, {nasty, nasty}, true}}, {{nasty, 3.5}}};
  const std::string doc = svg_plot(nasty, {p});
  EXPECT_EQ(well_formed_root(doc), "svg") << doc;
  EXPECT_EQ(doc.find(nasty), std::string::npos);
  size_t n = 0;
  for (size_t at = doc.find("a&lt;&amp;&gt;&quot;b"); at != std::string::npos;
       at = doc.find("a&lt;&amp;&gt;&quot;b", at + 1)) {
    ++n;
  }
  EXPECT_EQ(n, 8u);  // document and panel titles, two axis labels, legend, hline, two point labels
}

TEST(SvgNiceTicks, KnownRanges) {
  auto expect_ticks = [](double lo, double hi, int max, std::vector<double> want) {
    const std::vector<double> got = nice_ticks(lo, hi, max);
    ASSERT_EQ(got.size(), want.size()) << "[" << lo << ", " << hi << "] max " << max;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  };
  expect_ticks(0, 1, 6, {0, 0.2, 0.4, 0.6, 0.8, 1.0});
  expect_ticks(0, 1, 11, {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0});
  expect_ticks(3, 97, 6, {0, 20, 40, 60, 80, 100});
  expect_ticks(3, 97, 5, {0, 50, 100});
  expect_ticks(-0.3, 0.7, 7, {-0.4, -0.2, 0, 0.2, 0.4, 0.6, 0.8});
  expect_ticks(1200, 1850, 8, {1200, 1300, 1400, 1500, 1600, 1700, 1800, 1900});
  expect_ticks(-1, 1, 3, {-1, 0, 1});
  expect_ticks(-0.1, 1, 3, {-1, 0, 1});  // straddles 0, so 3 ticks is the least
  // One rounding per tick: 0.6 is the double 0.6, not 3 * 0.2.
  EXPECT_EQ(nice_ticks(0, 1, 6)[3], 0.6);
  EXPECT_THROW(nice_ticks(1, 1, 6), Error);
  EXPECT_THROW(nice_ticks(2, 1, 6), Error);
  EXPECT_THROW(nice_ticks(0, NAN, 6), Error);
  EXPECT_THROW(nice_ticks(0, 1, 2), Error);
}

TEST(SvgNiceTicks, CoverTheRangeWithNiceEvenSteps) {
  const double ranges[][2] = {{0, 1},       {3, 97},        {-5.5, 2.25},   {1e-7, 3e-7},
                              {0.61, 0.83}, {1e6, 1e6 + 3}, {-1e9, -2.5e8}, {0.001, 12345}};
  for (auto [lo, hi] : ranges) {
    for (int max : {3, 4, 5, 6, 7, 10}) {
      const std::vector<double> t = nice_ticks(lo, hi, max);
      SCOPED_TRACE(testing::Message() << "[" << lo << ", " << hi << "] max " << max);
      ASSERT_GE(t.size(), 2u);
      EXPECT_LE(int(t.size()), max);
      const double step = t[1] - t[0], tol = 1e-9 * step;
      EXPECT_LE(t.front(), lo + tol);
      EXPECT_GE(t.back(), hi - tol);
      EXPECT_GT(t.front() + step, lo);  // no wasted tick at either end
      EXPECT_LT(t.back() - step, hi);
      for (size_t i = 1; i < t.size(); ++i) EXPECT_NEAR(t[i] - t[i - 1], step, tol);
      const double mantissa = step / std::pow(10.0, std::floor(std::log10(step)));
      EXPECT_TRUE(std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 || std::abs(mantissa - 5) < 1e-6)
          << step;
    }
  }
}

TEST(SvgPlot, PointsIncludingTheMaximumMapInsideThePlotArea) {
  // The cascade's maxima (0.83, 14.2) are not ticks, so its axes end beyond them; below, 1.0 is.
  expect_points_inside(svg_plot("t", {cascade_panel()}));
  PlotPanel p{"", "", "", {{"s", {0.0, 0.5, 1.0}, {0.0, 1.0, 0.25}, {}, true}}, {}};
  const std::string doc = svg_plot("t", {p});
  expect_points_inside(doc);
  const Rect r = plot_area(doc);
  const auto pts = points(doc);
  ASSERT_EQ(pts.size(), 3u);
  EXPECT_NEAR(pts[2].first, r.x + r.w, 0.05);  // x = 1.0 is the last tick: the right edge
  EXPECT_NEAR(pts[0].first, r.x, 0.05);
  EXPECT_NEAR(pts[1].second, r.y, 0.05);  // y = 1.0: the top edge
}

TEST(SvgPlot, LegendAvoidsTheData) {
  // A rising curve fills the top-right and bottom-left corners; the legend goes top left.
  PlotSeries rising{"rising", {}, {}, {}, true};
  for (int i = 0; i <= 20; ++i) rising.x.push_back(i), rising.y.push_back(i * i);
  const std::string doc = svg_plot("t", {PlotPanel{"p", "x", "y", {rising}, {}}});
  static const std::regex re("class=\"legend\" x=\"([-0-9.]+)\" y=\"([-0-9.]+)\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(doc, m, re));
  const Rect r = plot_area(doc);
  EXPECT_LT(std::stod(m[1]), r.x + r.w / 2);
  EXPECT_LT(std::stod(m[2]), r.y + r.h / 2);
}

TEST(SvgPlot, FlatRangesAndASinglePointStillDraw) {
  for (const PlotSeries& s :
       {PlotSeries{"one", {0.5}, {7.0}, {}, true}, PlotSeries{"flat", {1, 2, 3}, {2, 2, 2}, {}, true},
        PlotSeries{"zero", {0, 0}, {0, 0}, {}, true}}) {
    const std::string doc = svg_plot("flat", {PlotPanel{"p", "x", "y", {s}, {}}});
    SCOPED_TRACE(s.name);
    EXPECT_EQ(well_formed_root(doc), "svg");
    EXPECT_EQ(points(doc).size(), s.x.size());
    expect_points_inside(doc);
    EXPECT_EQ(doc.find("nan"), std::string::npos);
    EXPECT_EQ(doc.find("inf"), std::string::npos);
    EXPECT_EQ(doc.find("no data"), std::string::npos);
  }
}

TEST(SvgPlot, EmptyPanelDrawsAxesAndSaysNoData) {
  PlotPanel empty{"nothing yet", "quality", "load", {}, {}};
  PlotPanel all_nan{"all NaN", "quality", "load", {{"s", {NAN}, {1.0}, {}, true}}, {{"ref", 2}}};
  for (const PlotPanel& p : {empty, all_nan}) {
    const std::string doc = svg_plot("t", {p});
    EXPECT_EQ(well_formed_root(doc), "svg") << doc;
    EXPECT_NE(doc.find(">no data<"), std::string::npos);
    EXPECT_NE(doc.find("class=\"plot-area\""), std::string::npos);
    EXPECT_NE(doc.find(">quality<"), std::string::npos);
    EXPECT_TRUE(points(doc).empty());
  }
}

TEST(SvgPlot, PointLabelsAppear) {
  const std::string doc = svg_plot("t", {cascade_panel()});
  for (const char* label : {">T=0.2<", ">T=0.4<", ">T=0.6<", ">T=0.8<"}) {
    EXPECT_NE(doc.find(label), std::string::npos) << label;
  }
}

TEST(SvgPlot, NonFinitePointsAreSkipped) {
  PlotSeries s{"s", {0.1, NAN, 0.3, 0.4, INFINITY}, {1, 2, NAN, 4, 5}, {"a", "b", "c", "d", "e"}};
  const std::string doc = svg_plot("t", {PlotPanel{"p", "x", "y", {s}, {{"bad ref", NAN}}}});
  EXPECT_EQ(well_formed_root(doc), "svg");
  EXPECT_EQ(points(doc).size(), 2u);
  EXPECT_EQ(doc.find("nan"), std::string::npos);
  EXPECT_EQ(doc.find("inf"), std::string::npos);
  EXPECT_NE(doc.find(">a<"), std::string::npos);
  EXPECT_EQ(doc.find(">b<"), std::string::npos);  // its point was skipped
  EXPECT_EQ(doc.find("bad ref"), std::string::npos);
  expect_points_inside(doc);
}

TEST(SvgPlot, MismatchedSeriesLengthsThrowNamingTheSeries) {
  PlotPanel p{"latency", "", "", {{"cascade", {1, 2}, {1}, {}, true}}, {}};
  try {
    svg_plot("t", {p});
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[svg]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cascade"), std::string::npos) << e.what();
  }
  p.series[0].y = {1, 2};
  p.series[0].labels = {"only one"};
  EXPECT_THROW(svg_plot("t", {p}), Error);
}

TEST(SvgPlot, WritesTheFileAndABadPathThrowsNamingIt) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "loom_svg_plot";
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "plot.svg").string();
  write_svg_plot(good, "t", {cascade_panel()});
  EXPECT_EQ(read_file(good), svg_plot("t", {cascade_panel()}));

  const std::string bad = (dir / "no_such_dir" / "plot.svg").string();
  try {
    write_svg_plot(bad, "t", {cascade_panel()});
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[svg] cannot write plot " + bad, 0), 0u) << e.what();
  }
  std::filesystem::remove_all(dir);
}
