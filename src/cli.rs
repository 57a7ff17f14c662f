//! Offline commands.
