//! The relay suite, one test binary: telegrams through the hub end to end
//! (`relay_*`), the fault matrix, and the load driver's counting.
//!
//! ```sh
//! cargo test --test relay                   # the whole suite
//! cargo test --test relay relay_faults::    # one file's tests
//! ```

#[path = "../chaos_support/mod.rs"]
mod chaos_support;
#[path = "../common/mod.rs"]
mod common;

mod bench_counting;
mod fault_matrix;
mod relay_codes;
mod relay_drain;
mod relay_faults;
mod relay_format;
mod relay_inquiry;
mod relay_names;
mod relay_process;
mod relay_wire;
