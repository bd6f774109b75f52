//! iris-proto (being built).
