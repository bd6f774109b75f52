//! iris-model (being built).
