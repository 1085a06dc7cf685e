#include "loom/parallel/mesh_shape.h"

#include "loom/core/error.h"

namespace loom::parallel {

const char* dim_name(Dim d) {
  switch (d) {
    case Dim::pp: return "pp";
    case Dim::dp: return "dp";
    case Dim::ep: return "ep";
    case Dim::tp: return "tp";
  }
  return "?";
}

int64_t MeshCoord::operator[](Dim d) const {
  switch (d) {
    case Dim::pp: return pp;
    case Dim::dp: return dp;
    case Dim::ep: return ep;
    case Dim::tp: return tp;
  }
  return 0;
}

int64_t& MeshCoord::at(Dim d) {
  switch (d) {
    case Dim::pp: return pp;
    case Dim::dp: return dp;
    case Dim::ep: return ep;
    case Dim::tp: return tp;
  }
  return pp;
}

MeshOrder parse_mesh_order(const std::string& text) {
  MeshOrder o{};
  size_t n = 0, start = 0;
  bool seen[4] = {false, false, false, false};
  bool ok = true;
  while (ok && start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string name = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int found = -1;
    for (int i = 0; i < 4; ++i)
      if (name == dim_name(Dim(i))) found = i;
    ok = found >= 0 && !seen[found] && n < 4;
    if (ok) {
      seen[found] = true;
      o[n++] = Dim(found);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  LOOM_CHECK(ok && n == 4, "config", "parallel.order '", text,
             "' must name pp, dp, ep and tp once each, outermost first (default pp,dp,ep,tp)");
  return o;
}

MeshShape::MeshShape(int64_t pp, int64_t dp, int64_t ep, int64_t tp, MeshOrder order)
    : sizes_{pp, dp, ep, tp}, order_(order) {
  for (int i = 0; i < 4; ++i)
    LOOM_CHECK(sizes_[size_t(i)] >= 1, "mesh", "parallel.", dim_name(Dim(i)), "=", sizes_[size_t(i)],
               " must be at least 1");
}

void MeshShape::check_world_size(int64_t world) const {
  LOOM_CHECK(world == world_size(), "mesh", "world size ", world, " does not match ", describe(), " = ", world_size(),
             "; launch ", world_size(), " processes or change parallel.* so that ", "pp x dp x ep x tp = ", world);
}

MeshCoord MeshShape::coord(int64_t rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size(), "mesh", "rank ", rank, " outside world of ", world_size());
  MeshCoord c;
  for (int i = 3; i >= 0; --i) {  // innermost first
    const Dim d = order_[size_t(i)];
    c.at(d) = rank % size(d);
    rank /= size(d);
  }
  return c;
}

int64_t MeshShape::rank_of(const MeshCoord& c) const {
  int64_t r = 0;
  for (Dim d : order_) r = r * size(d) + c[d];
  return r;
}

std::vector<int64_t> MeshShape::group_ranks(int64_t rank, Dim d) const {
  MeshCoord c = coord(rank);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < size(d); ++i) {
    MeshCoord m = c;
    m.at(d) = i;
    out.push_back(rank_of(m));
  }
  return out;
}

int64_t MeshShape::group_color(int64_t rank, Dim d) const {
  return group_ranks(rank, d).front();  // the member with coordinate 0 names the group
}

std::string MeshShape::describe() const {
  std::string s = str_cat("pp=", sizes_[0], " x dp=", sizes_[1], " x ep=", sizes_[2], " x tp=", sizes_[3]);
  if (order_ != kDefaultMeshOrder) s += str_cat(" (order ", mesh_order_name(order_), ")");
  return s;
}

std::string mesh_order_name(const MeshOrder& order) {
  return str_cat(dim_name(order[0]), ",", dim_name(order[1]), ",", dim_name(order[2]), ",", dim_name(order[3]));
}

}  // namespace loom::parallel
