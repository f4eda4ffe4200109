//! Starting, stopping and breaking the sim cluster's processes.
