//! Typed ids of the fit's dense tables: a node and a resource are positions in the same
//! rows, so each gets its own type. Below `statics` and `node`, which both use them.

/// A usable node of a [`Capacity`](super::node::Capacity): its position in `nodes` and in
/// the [`Rows`](super::node::Rows). A type, not a bare `usize`, so a node and a resource
/// cannot trade places in `free[n][r]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub(crate) struct NodeId(usize);

impl NodeId {
    /// The position, for indexing a per-node vector.
    pub(crate) fn index(self) -> usize {
        self.0
    }

    /// The ids of `count` nodes, in order.
    pub(crate) fn all(count: usize) -> impl Iterator<Item = NodeId> {
        (0..count).map(NodeId)
    }
}

/// The node at position `i` of a per-node vector (as `enumerate` gives it).
impl From<usize> for NodeId {
    fn from(i: usize) -> Self {
        NodeId(i)
    }
}

/// A resource interned by [`Names`](super::node::Names): its position in the dense
/// per-node rows and [`Amounts`](super::node::Amounts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub(crate) struct ResourceId(usize);

impl ResourceId {
    /// The position, for indexing a per-resource vector.
    pub(crate) fn index(self) -> usize {
        self.0
    }

    /// The ids of the first `width` resources, in order.
    pub(crate) fn all(width: usize) -> impl Iterator<Item = ResourceId> {
        (0..width).map(ResourceId)
    }
}

/// The resource at position `i` of an [`Amounts`](super::node::Amounts) (as `enumerate`
/// gives it).
impl From<usize> for ResourceId {
    fn from(i: usize) -> Self {
        ResourceId(i)
    }
}
