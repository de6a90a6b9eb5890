//! FAST's sorted prefetch, for rotational disks: the schedule in physical
//! order instead of time order.

use crate::plan::PlanFile;

use super::input::Span;
use super::schedule::Item;

/// FAST's sorted prefetch: lookups in schedule order, then metadata by
/// (device, offset), then data by the file's device and physical address;
/// data whose address is unknown keeps its order, last.
pub(super) fn sort_physical(
    items: Vec<Item>,
    devices: &[(u64, Vec<Span>)],
    files: &[PlanFile],
    physical: &dyn Fn(&PlanFile, u64) -> Option<u64>,
) -> Vec<Item> {
    let mut lookups = Vec::new();
    let mut metas = Vec::new();
    let mut datas = Vec::new();
    for item in items {
        match item {
            Item::Lookup(_) => lookups.push(item),
            Item::Meta(r) => metas.push(((devices[r.key as usize].0, r.start), item)),
            Item::Data(r) => {
                let f = &files[r.key as usize];
                let key = physical(f, r.start).map_or((1, 0, 0), |p| (0, f.id.dev, p));
                datas.push((key, item));
            }
        }
    }
    metas.sort_by_key(|(key, _)| *key);
    datas.sort_by_key(|(key, _)| *key);
    lookups
        .into_iter()
        .chain(metas.into_iter().map(|(_, item)| item))
        .chain(datas.into_iter().map(|(_, item)| item))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn sorted_order() {
        let trace = t()
            .op(NsOpKind::Stat, "/etc/x", -2, 0)
            .meta(9, 50, 1, 0)
            .file("/a", 1, &[(0, 1, 1), (5, 1, 3)])
            .file("/b", 2, &[(0, 1, 2)])
            .file("/c", 3, &[(0, 1, 4)])
            .meta(8, 100, 1, 5)
            .meta(8, 7, 1, 6)
            .done();
        let physical = |f: &PlanFile, off: u64| match (f.path.as_str(), off / P) {
            ("/a", 0) => Some(3000 * P),
            ("/a", 5) => Some(1000 * P),
            ("/b", 0) => Some(2000 * P),
            _ => None,
        };
        let opts = CompileOptions {
            sorted: true,
            metadata_shift: DEFAULT_METADATA_SHIFT,
            ..plain()
        };
        let c = compile(&[trace], &opts, &physical).unwrap();
        assert_eq!(
            show(&c.plan),
            vec![
                "stat /etc/x",
                "meta8:7+1",
                "meta8:100+1",
                "meta9:50+1",
                "/a 5+1",
                "/b 0+1",
                "/a 0+1",
                "/c 0+1",
            ]
        );
        assert!(c.plan.meta.sorted);
        assert_eq!(c.plan.meta.passes.last().unwrap(), "sort physical");
        assert!(!c
            .plan
            .meta
            .passes
            .iter()
            .any(|p| p.starts_with("meta-shift")));
    }
}
