//! Talaria's learning loop: what the agent learns and keeps.
//!
//! # Layout
//!
//! - [`skills`]: the skills library: bundled skills and the user's,
//!   SKILL.md parsing and validation, writes that stay inside their folder,
//!   `.usage.json` telemetry, and the cached skills index for the prompt.
//! - [`tools`]: `skills_list`, `skill_view` and `skill_manage` for the
//!   model (`skills_list` carries the index into new sessions' prompts).
//! - [`invoke`]: `/skill-name` in chat, the skill loaded for one turn.
//! - [`review`]: the background review that distils conversations into
//!   memory and skills after the answer is out, never delaying it.
//! - [`scratch`]: an in-memory session store for reviews.
//! - [`mem0`]: an external memory provider for mem0-compatible services.
//! - [`log`]: the append-only learning log of every change to skills and
//!   memory, with contents kept by hash for rollback.
//! - [`skill_history`]: that log read per skill: the skills the agent
//!   wrote, and rolling one back.
//! - [`restore`]: a skill's SKILL.md or a memory file put back to a
//!   version the log kept (one step back, or by hash), by anyone.
//! - [`graph`]: the learning graph (every skill by who wrote it, memory
//!   cards, their links) as JSON, DOT or a self-contained HTML page.
//! - [`curator`]: agent-written skills that go unused turn stale, then
//!   are archived (restorable), on an injected clock.
//!
//! # Invariants
//!
//! - **Only the user's skills change**; bundled ones are read-only, and no
//!   write leaves its skill folder.
//! - **A session's prompt never changes**: the index is read when a
//!   session starts; a skill written during it shows from the next.
#![forbid(unsafe_code)]

pub mod curator;
pub mod graph;
pub mod invoke;
pub mod log;
pub mod mem0;
pub mod restore;
pub mod review;
pub mod scratch;
pub mod skill_history;
pub mod skills;
pub mod tools;

pub use skills::{Library, SkillError, SkillInfo};
pub use tools::{review_skill_tools, skill_tools};
