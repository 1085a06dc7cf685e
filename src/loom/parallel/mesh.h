// parallel::Mesh: the rank grid and the communication group of every dimension, built once
// from the world group and passed to whatever needs a group (ARCHITECTURE.md, invariant 4).
#pragma once
#include "loom/comm/group.h"
#include "loom/parallel/mesh_shape.h"

namespace loom::parallel {

class Mesh {
 public:
  // Collective over `world`: splits it into the pp, dp, ep and tp groups. Throws naming the
  // arithmetic when world.size() != pp * dp * ep * tp.
  Mesh(const comm::Group& world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return world_.rank(); }
  const comm::Group& world() const { return world_; }
  const comm::Group& group(Dim d) const { return groups_[size_t(d)]; }
  const comm::Group& dp() const { return group(Dim::dp); }
  const comm::Group& tp() const { return group(Dim::tp); }
  const comm::Group& pp() const { return group(Dim::pp); }
  const comm::Group& ep() const { return group(Dim::ep); }

 private:
  comm::Group world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::array<comm::Group, 4> groups_;
};

}  // namespace loom::parallel
