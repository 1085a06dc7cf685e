// The rank grid pp x dp x ep x tp: coordinates of a rank and the members of each dimension's
// group. By default tp is innermost, so tensor-parallel peers are consecutive ranks, which
// launchers place on one host, and dp and pp outermost, across hosts; parallel.order changes
// the nesting. Pure arithmetic; Mesh (mesh.h) builds the communication groups from it.
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
  int64_t& at(Dim d);
};

// Dimensions from outermost (slowest-varying rank) to innermost.
using MeshOrder = std::array<Dim, 4>;
inline constexpr MeshOrder kDefaultMeshOrder = {Dim::pp, Dim::dp, Dim::ep, Dim::tp};
// "pp,dp,ep,tp" -> the order; throws "[config] parallel.order ..." unless each appears once.
MeshOrder parse_mesh_order(const std::string& text);
// "pp,dp,ep,tp": the order as parallel.order spells it (parse_mesh_order's inverse).
std::string mesh_order_name(const MeshOrder& order);

class MeshShape {
 public:
  MeshShape(int64_t pp, int64_t dp, int64_t ep, int64_t tp, MeshOrder order = kDefaultMeshOrder);
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
  // "pp=2 x dp=2 x ep=1 x tp=2", plus " (order tp,dp,pp,ep)" when not the default.
  std::string describe() const;
  const MeshOrder& order() const { return order_; }

 private:
  std::array<int64_t, 4> sizes_;
  MeshOrder order_;
};

}  // namespace loom::parallel
