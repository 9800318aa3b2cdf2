//! The lab's library: what its binary (`paybus-lab bench`, `paybus-lab chaos`) and the
//! end-to-end fault tests share — services of a run's own ([`services`]).

pub mod services;
