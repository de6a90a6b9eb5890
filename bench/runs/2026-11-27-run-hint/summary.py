import collections,statistics as st,sys
rows=[l.split() for l in open(sys.argv[1]) if l.strip() and l.split()[0] in('npm','clang','python')]
by=collections.defaultdict(dict)
for r in rows:
    by[(r[0],int(r[1]))][r[2]]=(float(r[3]),float(r[5]),float(r[6]),r[4])
for p in ['npm','clang','python']:
    ks=[k for k in by if k[0]==p and 'old' in by[k] and 'new' in by[k]]
    if not ks: continue
    d=[by[k]['new'][0]-by[k]['old'][0] for k in ks]
    o=[by[k]['old'][0] for k in ks]; n=[by[k]['new'][0] for k in ks]
    print(p, len(ks), 'old med %.1f new med %.1f'%(st.median(o),st.median(n)), 'new faster in %d'%sum(x<0 for x in d), 'median diff %.1f'%st.median(d),
      'before old %.1f new %.1f'%(st.median(by[k]['old'][1] for k in ks), st.median(by[k]['new'][1] for k in ks)),
      'held old %.1f new %.1f'%(st.median(by[k]['old'][2] for k in ks), st.median(by[k]['new'][2] for k in ks)),
      'phases', collections.Counter(by[k][v][3] for k in ks for v in ('old','new')))
