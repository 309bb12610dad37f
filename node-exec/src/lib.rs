//! kuport node executor
