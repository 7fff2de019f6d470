//! Test servers for Talaria, bound to 127.0.0.1 on an ephemeral port.
#![forbid(unsafe_code)]
