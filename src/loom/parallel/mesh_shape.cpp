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

MeshShape::MeshShape(int64_t pp, int64_t dp, int64_t ep, int64_t tp) : sizes_{pp, dp, ep, tp} {
  for (int i = 0; i < 4; ++i)
    LOOM_CHECK(sizes_[size_t(i)] >= 1, "mesh", "parallel.", dim_name(Dim(i)), "=",
               sizes_[size_t(i)], " must be at least 1");
}

void MeshShape::check_world_size(int64_t world) const {
  LOOM_CHECK(world == world_size(), "mesh", "world size ", world, " does not match ", describe(),
             " = ", world_size(), "; launch ", world_size(), " processes or change parallel.* so that ",
             "pp x dp x ep x tp = ", world);
}

MeshCoord MeshShape::coord(int64_t rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size(), "mesh", "rank ", rank, " outside world of ",
             world_size());
  MeshCoord c;
  c.tp = rank % sizes_[3];
  rank /= sizes_[3];
  c.ep = rank % sizes_[2];
  rank /= sizes_[2];
  c.dp = rank % sizes_[1];
  c.pp = rank / sizes_[1];
  return c;
}

int64_t MeshShape::rank_of(const MeshCoord& c) const {
  return ((c.pp * sizes_[1] + c.dp) * sizes_[2] + c.ep) * sizes_[3] + c.tp;
}

std::vector<int64_t> MeshShape::group_ranks(int64_t rank, Dim d) const {
  MeshCoord c = coord(rank);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < size(d); ++i) {
    MeshCoord m = c;
    switch (d) {
      case Dim::pp: m.pp = i; break;
      case Dim::dp: m.dp = i; break;
      case Dim::ep: m.ep = i; break;
      case Dim::tp: m.tp = i; break;
    }
    out.push_back(rank_of(m));
  }
  return out;
}

int64_t MeshShape::group_color(int64_t rank, Dim d) const {
  return group_ranks(rank, d).front();  // the member with coordinate 0 names the group
}

std::string MeshShape::describe() const {
  return str_cat("pp=", sizes_[0], " x dp=", sizes_[1], " x ep=", sizes_[2], " x tp=", sizes_[3]);
}

}  // namespace loom::parallel
