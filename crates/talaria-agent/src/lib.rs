//! Talaria's agent: a stateless turn loop over a model, with tools.
//!
//! # Layout
//!
//! - [`interaction`]: the seam to a human (approvals, clarifying questions).
//! - [`tools`]: the [`tools::Tool`] trait, the registry, and the core tools.
//!
//! # Invariant
//!
//! This crate knows nothing about chat platforms: a turn gets text in and
//! gives text and transcript rows out.
#![forbid(unsafe_code)]

pub mod interaction;
pub mod tools;
