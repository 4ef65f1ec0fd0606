//! The property suite, one test binary: the frame codec (`prop_frame`) and
//! the layouts (`prop_layout`) under generated input.
//!
//! ```sh
//! PROPTEST_CASES=100000 cargo test --release --test props
//! ```

mod prop_frame;
mod prop_layout;
