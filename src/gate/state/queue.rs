//! The queue discipline of one bucket (SPEC §2, §8): strict priority
//! between bands, weighted fair sharing between tenants inside a band, FIFO
//! inside a tenant, and aging that lifts a band by the wait of its oldest
//! request.
//!
//! With every request in one band and of one tenant — the default — this is
//! exactly a FIFO queue: one band, one flow, served in arrival order.
//!
//! # Structure
//!
//! Requests live in the state's entry slab; the queue threads two intrusive
//! lists through them ([`Node`]): the band's arrival order (its oldest for
//! aging, its newest for displacement) and the tenant's own FIFO. Each band
//! keeps its tenants' *flows* and a min-heap of their heads keyed by
//! start-time fair queueing tags: a flow's head starts at the later of the
//! band's virtual time and the flow's last finish tag, and finishes
//! `service / weight` later, where service is the request's tokens when
//! known and 1 otherwise. The band serves the head with the smallest start
//! tag, ties by arrival.
//!
//! Costs per event: push, pop and unlink are O(log tenants) (heap) plus
//! O(1) list work; finding the head is O(log bands) without aging and
//! O(bands) with it. Heap entries made stale by a cancelled flow head are
//! skipped lazily and the heap is rebuilt when stale entries outnumber live
//! ones, so memory stays bounded under cancel storms; a band that empties is
//! dropped whole.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use super::Slot;
use crate::gate::types::Tenant;

/// Fixed-point scale of fair queueing tags: a multiple of every weight up
/// to 16, so common weights divide service exactly.
const TAG_SCALE: u128 = 720_720;

/// A place in one intrusive list. Neighbours are stored as slot + 1 in
/// four bytes each, which keeps a queued request's node small.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    prev: Option<NonZeroU32>,
    next: Option<NonZeroU32>,
}

impl Link {
    fn new(prev: Option<Slot>, next: Option<Slot>) -> Link {
        Link {
            prev: prev.map(Link::pack),
            next: next.map(Link::pack),
        }
    }

    fn pack(slot: Slot) -> NonZeroU32 {
        u32::try_from(slot)
            .ok()
            .and_then(|slot| NonZeroU32::new(slot.wrapping_add(1)))
            .expect("fewer than 4 billion queued requests")
    }

    fn prev(&self) -> Option<Slot> {
        self.prev.map(|packed| packed.get() as Slot - 1)
    }

    fn next(&self) -> Option<Slot> {
        self.next.map(|packed| packed.get() as Slot - 1)
    }

    fn set_prev(&mut self, prev: Option<Slot>) {
        self.prev = prev.map(Link::pack);
    }

    fn set_next(&mut self, next: Option<Slot>) {
        self.next = next.map(Link::pack);
    }
}

/// The two ends of an intrusive list.
#[derive(Debug, Default, Clone, Copy)]
struct Ends {
    head: Option<Slot>,
    tail: Option<Slot>,
}

/// What the queue keeps of each queued request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    /// Arrival order; lower is older.
    pub(crate) seq: u64,
    /// Its band, as a rung of the ladder (see [`Ladder`]).
    pub(crate) rung: i64,
    pub(crate) tenant: Option<Tenant>,
    /// Fair queueing tag increment: service × scale / weight.
    pub(crate) step: u128,
    /// When it was queued, when the gate keeps time.
    pub(crate) queued_at: Option<Instant>,
    band: Link,
    flow: Link,
}

impl Node {
    pub(crate) fn new(
        seq: u64,
        rung: i64,
        tenant: Option<Tenant>,
        service: u64,
        weight: u32,
        queued_at: Option<Instant>,
    ) -> Node {
        Node {
            seq,
            rung,
            tenant,
            step: u128::from(service.max(1)) * TAG_SCALE / u128::from(weight.max(1)),
            queued_at,
            band: Link::default(),
            flow: Link::default(),
        }
    }
}

/// Access to the nodes of queued requests, by slot.
pub(crate) trait Nodes {
    fn node(&self, slot: Slot) -> &Node;
    fn node_mut(&mut self, slot: Slot) -> &mut Node;
}

/// How priorities map to bands, and how bands age.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ladder {
    /// Configured bands, ascending; empty: every priority is its own band.
    bands: Vec<i32>,
    aging: Option<Duration>,
}

impl Ladder {
    pub(crate) fn new(bands: Vec<i32>, aging: Option<Duration>) -> Ladder {
        Ladder { bands, aging }
    }

    /// The rung of a priority: the index of the highest configured band at
    /// or below it (the lowest band if below them all), or the priority
    /// itself when no bands are configured.
    pub(crate) fn rung(&self, priority: i32) -> i64 {
        if self.bands.is_empty() {
            return i64::from(priority);
        }
        let above = self.bands.partition_point(|&band| band <= priority);
        above.saturating_sub(1) as i64
    }

    /// How many bands are configured (0: every priority is its own band).
    /// With bands configured, a rung is an index below this.
    pub(crate) fn configured_bands(&self) -> usize {
        self.bands.len()
    }

    /// Whether bands rise with time.
    pub(crate) fn ages(&self) -> bool {
        self.aging.is_some()
    }

    /// The rung a band has risen to by `now`, its oldest request queued at
    /// `since`: one rung per aging interval waited.
    fn aged(&self, rung: i64, since: Option<Instant>, now: Option<Instant>) -> i64 {
        let (Some(interval), Some(since), Some(now)) = (self.aging, since, now) else {
            return rung;
        };
        let waited = now.saturating_duration_since(since);
        let steps = waited.as_nanos() / interval.as_nanos().max(1);
        rung.saturating_add(i64::try_from(steps).unwrap_or(i64::MAX))
    }
}

/// One tenant's queued requests in one band.
#[derive(Debug, Default)]
struct Flow {
    fifo: Ends,
    /// Start tag of the flow's head.
    head_start: u128,
    /// Finish tag of the flow's last served request.
    last_finish: u128,
}

/// Hashes a flow's key. A [`Tenant`] is a hash of its name already (and
/// names come from a trusted router): one multiply spreads it, where the
/// default SipHash would cost more than the rest of a queue operation.
#[derive(Debug, Default)]
struct FlowHasher(u64);

impl Hasher for FlowHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, word: u64) {
        const K: u64 = 0x9E37_79B9_7F4A_7C15; // 2^64 / golden ratio
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    fn write_isize(&mut self, word: isize) {
        self.write_u64(word as u64);
    }
}

/// A head in a band's heap: (start tag, arrival, slot, tenant). Stale once
/// its flow's head is another request.
type HeapEntry = Reverse<(u128, u64, Slot, Option<Tenant>)>;

#[derive(Debug, Default)]
struct Band {
    arrivals: Ends,
    len: usize,
    flows: HashMap<Option<Tenant>, Flow, BuildHasherDefault<FlowHasher>>,
    /// Flows with queued requests.
    backlogged: usize,
    heads: BinaryHeap<HeapEntry>,
    /// The start tag of the request served last.
    virtual_time: u128,
}

impl Band {
    /// The flow head first in fair order, dropping stale heap entries.
    fn first(&mut self, nodes: &impl Nodes) -> Option<Slot> {
        while let Some(&Reverse((start, seq, slot, tenant))) = self.heads.peek() {
            let live = self.flows.get(&tenant).is_some_and(|flow| {
                flow.fifo.head == Some(slot)
                    && flow.head_start == start
                    && nodes.node(slot).seq == seq
            });
            if live {
                return Some(slot);
            }
            self.heads.pop();
        }
        None
    }

    /// The start tag a new request of `tenant` would get, and whether its
    /// flow has requests queued already (then it waits behind them).
    fn start_for(&self, tenant: Option<Tenant>) -> (u128, bool) {
        match self.flows.get(&tenant) {
            Some(flow) if flow.fifo.head.is_some() => (flow.head_start, true),
            Some(flow) => (flow.last_finish.max(self.virtual_time), false),
            None => (self.virtual_time, false),
        }
    }

    fn push_head(&mut self, nodes: &impl Nodes, tenant: Option<Tenant>) {
        let flow = &self.flows[&tenant];
        if let Some(head) = flow.fifo.head {
            self.heads.push(Reverse((
                flow.head_start,
                nodes.node(head).seq,
                head,
                tenant,
            )));
        }
    }

    /// Drops idle flows that hold no credit and stale heap entries, when
    /// they outnumber the live ones.
    fn compact(&mut self, nodes: &impl Nodes) {
        const SLACK: usize = 16;
        let live = self.backlogged;
        if self.flows.len() > 2 * live + SLACK {
            let now = self.virtual_time;
            self.flows
                .retain(|_, flow| flow.fifo.head.is_some() || flow.last_finish > now);
            self.flows.shrink_to_fit();
        }
        if self.heads.len() > 2 * live + SLACK {
            let mut heads = std::mem::take(&mut self.heads).into_vec();
            heads.clear();
            heads.shrink_to(2 * live + SLACK);
            self.heads = BinaryHeap::from(heads);
            let tenants: Vec<Option<Tenant>> = self
                .flows
                .iter()
                .filter(|(_, flow)| flow.fifo.head.is_some())
                .map(|(tenant, _)| *tenant)
                .collect();
            for tenant in tenants {
                self.push_head(nodes, tenant);
            }
        }
    }
}

/// The queue of one bucket.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    bands: BTreeMap<i64, Band>,
    len: usize,
}

/// The first request of a queue in service order, with what orders it
/// against other queues' heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) slot: Slot,
    /// The rung its band has risen to.
    pub(crate) rung: i64,
    pub(crate) seq: u64,
}

impl Head {
    /// Whether this head goes before `other` (of another queue): higher
    /// risen rung first, then the older.
    pub(crate) fn before(&self, other: &Head) -> bool {
        (Reverse(self.rung), self.seq) < (Reverse(other.rung), other.seq)
    }
}

impl Queue {
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queued requests per band rung (each request under the band it
    /// arrived in, however far it has aged), lowest first; only bands with
    /// requests.
    pub(crate) fn band_lengths(&self) -> impl Iterator<Item = (i64, usize)> + '_ {
        self.bands.iter().map(|(&rung, band)| (rung, band.len))
    }

    /// The request queued longest: the oldest arrival over every band. One
    /// look per band (one, by default).
    pub(crate) fn oldest(&self, nodes: &impl Nodes) -> Option<Slot> {
        self.bands
            .values()
            .filter_map(|band| band.arrivals.head)
            .min_by_key(|&slot| nodes.node(slot).seq)
    }

    /// Queued requests in bands at or above `rung`: those a request joining
    /// at `rung` waits behind, whatever their tenants (aging aside).
    pub(crate) fn at_or_above(&self, rung: i64) -> usize {
        self.bands.range(rung..).map(|(_, band)| band.len).sum()
    }

    /// Appends the request at `slot` (its node filled in but unlinked).
    pub(crate) fn push(&mut self, nodes: &mut impl Nodes, slot: Slot) {
        let Node { rung, tenant, .. } = *nodes.node(slot);
        let band = self.bands.entry(rung).or_default();
        let tail = band.arrivals.tail;
        nodes.node_mut(slot).band = Link::new(tail, None);
        match tail {
            Some(tail) => nodes.node_mut(tail).band.set_next(Some(slot)),
            None => band.arrivals.head = Some(slot),
        }
        band.arrivals.tail = Some(slot);
        band.len += 1;

        let (start, backlogged) = band.start_for(tenant);
        let flow = band.flows.entry(tenant).or_default();
        let tail = flow.fifo.tail;
        nodes.node_mut(slot).flow = Link::new(tail, None);
        match tail {
            Some(tail) => nodes.node_mut(tail).flow.set_next(Some(slot)),
            None => flow.fifo.head = Some(slot),
        }
        flow.fifo.tail = Some(slot);
        if !backlogged {
            flow.head_start = start;
            band.backlogged += 1;
            band.push_head(nodes, tenant);
        }
        self.len += 1;
    }

    /// The first request in service order at `now`.
    pub(crate) fn head(
        &mut self,
        nodes: &impl Nodes,
        ladder: &Ladder,
        now: Option<Instant>,
    ) -> Option<Head> {
        let (rung, (key, _)) = self.leading_band(nodes, ladder, now)?;
        let band = self.bands.get_mut(&key)?;
        let slot = band.first(nodes)?;
        Some(Head {
            slot,
            rung,
            seq: nodes.node(slot).seq,
        })
    }

    /// The band served first at `now`: its risen rung, and its key and the
    /// arrival of its oldest request. Without aging, the highest band.
    fn leading_band(
        &self,
        nodes: &impl Nodes,
        ladder: &Ladder,
        now: Option<Instant>,
    ) -> Option<(i64, (i64, u64))> {
        let oldest_of = |band: &Band| {
            let oldest = band.arrivals.head.expect("a band in the map is not empty");
            nodes.node(oldest)
        };
        if ladder.aging.is_none() {
            let (&rung, band) = self.bands.last_key_value()?;
            return Some((rung, (rung, oldest_of(band).seq)));
        }
        self.bands
            .iter()
            .map(|(&rung, band)| {
                let oldest = oldest_of(band);
                (ladder.aged(rung, oldest.queued_at, now), (rung, oldest.seq))
            })
            .min_by_key(|&(risen, (_, oldest))| (Reverse(risen), oldest))
    }

    /// Whether a request arriving now at `rung` for `tenant` would be first
    /// in service order: nothing queued goes before it. It joins its band
    /// (and rises with it); between bands the higher risen rung goes first,
    /// the band with the older request on a tie; inside its band it goes
    /// first if its start tag is below every waiting flow's.
    pub(crate) fn would_lead(
        &mut self,
        nodes: &impl Nodes,
        ladder: &Ladder,
        now: Option<Instant>,
        rung: i64,
        tenant: Option<Tenant>,
    ) -> bool {
        let Some((risen, (leading, _))) = self.leading_band(nodes, ladder, now) else {
            return true;
        };
        if leading != rung {
            // Its own band, if it has one, lost to the leading band already:
            // only a higher rung than the leader's can go first.
            return !self.bands.contains_key(&rung) && rung > risen;
        }
        let band = self.bands.get_mut(&rung).expect("the leading band exists");
        let (start, backlogged) = band.start_for(tenant);
        if backlogged {
            return false;
        }
        match band.first(nodes) {
            Some(first) => start < band.flows[&nodes.node(first).tenant].head_start,
            None => true,
        }
    }

    /// Takes the request at `slot` out of the queue. `served`: it leaves
    /// because it was admitted, and its flow is charged for it; otherwise
    /// (cancelled, expired, displaced) it leaves no trace in the fair
    /// shares.
    pub(crate) fn remove(&mut self, nodes: &mut impl Nodes, slot: Slot, served: bool) {
        let Node {
            rung,
            tenant,
            step,
            band: band_link,
            flow: flow_link,
            ..
        } = *nodes.node(slot);
        let band = self.bands.get_mut(&rung).expect("a queued request's band");
        match band_link.prev() {
            Some(prev) => nodes.node_mut(prev).band.set_next(band_link.next()),
            None => band.arrivals.head = band_link.next(),
        }
        match band_link.next() {
            Some(next) => nodes.node_mut(next).band.set_prev(band_link.prev()),
            None => band.arrivals.tail = band_link.prev(),
        }
        band.len -= 1;
        self.len -= 1;
        if band.len == 0 {
            self.bands.remove(&rung);
            if self.bands.is_empty() {
                // An emptied map keeps its root node: give it back too.
                self.bands = BTreeMap::new();
            }
            return;
        }

        let flow = band
            .flows
            .get_mut(&tenant)
            .expect("a queued request's flow");
        let was_head = flow_link.prev().is_none();
        match flow_link.prev() {
            Some(prev) => nodes.node_mut(prev).flow.set_next(flow_link.next()),
            None => flow.fifo.head = flow_link.next(),
        }
        match flow_link.next() {
            Some(next) => nodes.node_mut(next).flow.set_prev(flow_link.prev()),
            None => flow.fifo.tail = flow_link.prev(),
        }
        if was_head {
            if served {
                band.virtual_time = band.virtual_time.max(flow.head_start);
                flow.last_finish = flow.head_start + step;
                flow.head_start = flow.last_finish.max(band.virtual_time);
            }
            if flow.fifo.head.is_some() {
                band.push_head(nodes, tenant);
            } else {
                band.backlogged -= 1;
            }
        }
        band.compact(nodes);
    }

    /// Queued requests below `rung`, lowest band first and newest first
    /// within a band: the order they are displaced in. Lazy: a caller that
    /// needs one victim looks at one.
    pub(crate) fn displaceable<'a>(
        &'a self,
        nodes: &'a impl Nodes,
        rung: i64,
    ) -> impl Iterator<Item = Slot> + 'a {
        self.bands.range(..rung).flat_map(move |(_, band)| {
            std::iter::successors(band.arrivals.tail, move |&slot| {
                nodes.node(slot).band.prev()
            })
        })
    }

    /// Every queued request, emptying the queue.
    pub(crate) fn take_all(&mut self, nodes: &impl Nodes) -> Vec<Slot> {
        let mut slots = Vec::with_capacity(self.len);
        for band in self.bands.values() {
            let mut cursor = band.arrivals.head;
            while let Some(slot) = cursor {
                slots.push(slot);
                cursor = nodes.node(slot).band.next();
            }
        }
        *self = Queue::default();
        slots
    }
}
