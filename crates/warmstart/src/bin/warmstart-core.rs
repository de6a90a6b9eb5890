//! `warmstart-core`: every command; `warmstart` hands over to it.

fn main() {
    warmstart::core_main()
}
