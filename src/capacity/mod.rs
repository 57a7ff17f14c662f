//! What fits where.
