//! Test support: starts real redis-server processes. (Being written.)
