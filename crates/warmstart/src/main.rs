//! `warmstart`: the small front binary (see the library's documentation).

fn main() {
    warmstart::front::main()
}
