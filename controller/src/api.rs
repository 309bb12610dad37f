//! CRD types
