// The rank grid pp x dp x ep x tp (tp innermost, so tensor-parallel peers are neighbours,
// i.e. on one host): coordinates of a rank and the members of each dimension's group.
// Pure arithmetic; Mesh (mesh.h) builds the communication groups from it.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::parallel {

enum class Dim { pp = 0, dp = 1, ep = 2, tp = 3 };
const char* dim_name(Dim d);

struct MeshCoord {
  int64_t pp = 0, dp = 0, ep = 0, tp = 0;
  int64_t operator[](Dim d) const;
};

class MeshShape {
 public:
  MeshShape(int64_t pp, int64_t dp, int64_t ep, int64_t tp);
  int64_t size(Dim d) const { return sizes_[size_t(d)]; }
  int64_t world_size() const { return sizes_[0] * sizes_[1] * sizes_[2] * sizes_[3]; }
  // Throws "[mesh] world size 6 does not match pp=1 x dp=4 x ep=1 x tp=1 = 4; ..." naming the fix.
  void check_world_size(int64_t world) const;

  MeshCoord coord(int64_t rank) const;
  int64_t rank_of(const MeshCoord& c) const;
  // Ranks sharing every coordinate with `rank` except along `d`, ordered by that coordinate.
  std::vector<int64_t> group_ranks(int64_t rank, Dim d) const;
  // A color identifying the group of `rank` along `d` (equal for its members).
  int64_t group_color(int64_t rank, Dim d) const;
  std::string describe() const;  // "pp=2 x dp=2 x ep=1 x tp=2"

 private:
  std::array<int64_t, 4> sizes_;
};

}  // namespace loom::parallel
