//! The README's code blocks, compiled and run as doc tests (`cargo test -p readme-check --doc`),
//! so that what a new user copies works.
#![doc = include_str!("../../../README.md")]
#![forbid(unsafe_code)]
