//! iris-engine (being built).
