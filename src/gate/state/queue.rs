//! The queue discipline of one bucket (behaviour §2, §8): strict priority
//! between bands, weighted fair sharing between tenants inside a band, FIFO
//! inside a tenant, and aging that lifts a band by the wait of its oldest
//! request.
//!
//! With every request in one band and of one tenant — the default — this is
//! exactly a FIFO queue: one band, one flow, served in arrival order.
//!
//! # Fair sharing: start-time fair queueing with a service-driven clock
//!
//! Each band keeps its backlogged tenants' *flows* and serves the flow head
//! with the smallest start tag, ties by arrival. A flow's head starts at the
//! band's virtual time `v` when the flow becomes backlogged, and each
//! following request of the still backlogged flow starts where the one
//! before finished, `start + step`, where `step = service × SCALE / weight`
//! (service: the request's tokens when known, else 1); with no flow coming
//! or going this is exactly start-time fair queueing. The clock advances
//! with service, not with the tags served: each
//! dequeue adds `service × SCALE / W`, `W` the sum of the weights of the
//! band's backlogged flows at that moment, and then `v = max(v, start tag
//! served)`. So `v` tracks the progress of an ideal weighted fluid server
//! whatever flows come and go, and a tenant that appears (a fresh name per
//! request, say) starts level with the backlogged ones instead of at the
//! bottom of the order.
//!
//! Bound: over any interval in which flows `f` and `g` are both backlogged,
//! `|served_f / w_f − served_g / w_g| ≤ step_f / w_f + step_g / w_g` in
//! SCALE units (SFQ's bound, Goyal, Vin and Cheng 1996). A flow that empties
//! is forgotten at once, so gate memory stays O(queued requests): a tenant
//! that returns at once starts at `v` again and gains at most one step.
//! Tags are exact up to a rounding of `1 / SCALE` of a request: `SCALE =
//! 720,720 × 2^32` divides exactly by every weight up to 16, and no step of
//! any `u32` weight rounds to 0, so a huge weight never turns into strict
//! priority.
//!
//! Flows are keyed by [`Tenant`], itself a keyed hash of the tenant's name
//! (see its docs), so no client can pick names that collide flows or
//! impersonate a weighted tenant. The flow map hashes the tenant again with
//! a folded multiply under a random key ([`FlowHasher`](flow_hash::FlowHasher)), so that ids of
//! the application's own ([`Tenant::from_id`], sequential say) spread over
//! the map as well: one 128-bit multiply per look-up, where SipHash would
//! cost about as much as the rest of a queue operation.
//!
//! # Bands
//!
//! Bands are ordered by a *standing* that does not change with time: without
//! aging, minus the band's rung; with aging, the queue time of its oldest
//! request minus `rung × interval`. A band rises one rung per interval
//! waited, so the band of smallest standing is the one risen highest (of
//! two at the same whole rung, the one further along, then the older). A
//! queue keeps one band per distinct rung with requests queued and drops a
//! band as it empties: at most `min(queued requests, distinct priorities)`
//! bands, whatever the configuration; configured bands (`priority_bands`)
//! cap it at their number.
//!
//! # Parked flows (per-tenant limits)
//!
//! A flow whose tenant is at its engine limit is *parked*
//! ([`Queue::park`]): it leaves its band's heap of heads and its weight
//! leaves the band's backlogged weight, so the band serves the other flows
//! as if it had emptied, and a band of parked flows only is passed over.
//! Its requests keep their order in it; it is unparked when its tenant
//! has room again, or when its head leaves (it was parked for that head's
//! demand), and comes back as a flow that became backlogged, starting no
//! earlier than the band's clock. Without tenant limits nothing is parked.
//!
//! # Structure and costs
//!
//! Requests live in the state's entry slab; the queue threads two intrusive
//! lists through them ([`Node`]): the band's arrival order (its oldest for
//! aging, its newest for displacement) and the tenant's own FIFO. Each band
//! keeps its flows in a slab of its own, by a dense id, and a 4-ary
//! min-heap of their heads (see [`band`]); the queue keeps its bands'
//! oldest requests ordered by standing and by arrival. Push, pop and
//! unlink are O(log tenants + log bands) with O(1) list work; finding the
//! head is O(log bands). Heap entries made stale by a cancelled flow head
//! are skipped lazily and the heap is rebuilt when stale entries outnumber
//! live ones (amortised O(1)), so memory stays bounded under cancel storms.
//!
//! A deep queue's cost is its cache misses, so the hot path touches no
//! request it does not have to: a request knows its flow's id (no map
//! look-up to leave), and the arrival of the next request of its flow (a
//! leaving head does not read its successor, which in a queue of many
//! tenants was queued long after it and lies far away in memory).

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use self::band::Band;
use super::Slot;
use crate::gate::types::Tenant;

mod band;
mod flow_hash;
mod heads;

/// Fixed-point scale of fair queueing tags: a multiple of every weight up
/// to 16, times 2^32 so that a step of any `u32` weight is at least
/// 720,720 and the relative rounding of a step below 2^-19.
pub(crate) const TAG_SCALE: u128 = 720_720 << 32;

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

    fn unpack(packed: NonZeroU32) -> Slot {
        packed.get() as Slot - 1
    }

    fn prev(&self) -> Option<Slot> {
        self.prev.map(Link::unpack)
    }

    fn next(&self) -> Option<Slot> {
        self.next.map(Link::unpack)
    }

    fn set_prev(&mut self, prev: Option<Slot>) {
        self.prev = prev.map(Link::pack);
    }

    fn set_next(&mut self, next: Option<Slot>) {
        self.next = next.map(Link::pack);
    }
}

/// The two ends of an intrusive list, packed as [`Link`]'s neighbours are.
#[derive(Debug, Default, Clone, Copy)]
struct Ends {
    head: Option<NonZeroU32>,
    tail: Option<NonZeroU32>,
}

impl Ends {
    fn head(&self) -> Option<Slot> {
        self.head.map(Link::unpack)
    }

    fn tail(&self) -> Option<Slot> {
        self.tail.map(Link::unpack)
    }

    /// Links `slot` in after the tail; `link` is this list's link in a node.
    fn push_back(&mut self, nodes: &mut impl Nodes, slot: Slot, link: fn(&mut Node) -> &mut Link) {
        *link(nodes.node_mut(slot)) = Link::new(self.tail(), None);
        match self.tail() {
            Some(tail) => link(nodes.node_mut(tail)).set_next(Some(slot)),
            None => self.head = Some(Link::pack(slot)),
        }
        self.tail = Some(Link::pack(slot));
    }

    /// Unlinks the head, whose link in this list was `own`, leaving its
    /// successor's `prev` as it was: a head's `prev` is never read (heads
    /// are told by [`Ends::head`]), and the successor of a leaving flow
    /// head may be far away in memory.
    fn pop_front(&mut self, own: Link) {
        self.head = own.next;
        if own.next.is_none() {
            self.tail = None;
        }
    }

    /// Links the neighbours of the node whose link in this list was `own`
    /// to each other (its own link is left as it was).
    fn unlink(&mut self, nodes: &mut impl Nodes, own: Link, link: fn(&mut Node) -> &mut Link) {
        match own.prev() {
            Some(prev) => link(nodes.node_mut(prev)).set_next(own.next()),
            None => self.head = own.next,
        }
        match own.next() {
            Some(next) => link(nodes.node_mut(next)).set_prev(own.prev()),
            None => self.tail = own.prev,
        }
    }
}

/// What the queue keeps of each queued request.
///
/// Laid out by hand (`repr(C)`, sixteen-byte aligned, in an entry whose
/// start is too): what a newcomer writes into its flow's tail, which in a
/// queue of many tenants was queued long ago and is out of cache, is one
/// aligned sixteen bytes (`flow`, `next_seq`), so it never straddles two
/// cache lines.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct Node {
    pub(crate) tenant: Option<Tenant>,
    /// When it was queued, when the gate keeps time.
    pub(crate) queued_at: Option<Instant>,
    /// Fair queueing tag increment: service × scale / weight.
    pub(crate) step: u128,
    /// The standing of its band while it is the band's oldest request
    /// (see [`Ladder::standing`]).
    standing: i128,
    /// Arrival order; lower is older.
    pub(crate) seq: u64,
    /// Its band, as a rung of the ladder (see [`Ladder`]).
    pub(crate) rung: i64,
    /// Its place in its flow. A flow's head keeps a stale `prev` (see
    /// [`Ends::pop_front`]).
    flow: Link,
    /// The arrival of the next request of its flow, if it has one: a flow
    /// whose head leaves learns its new head's arrival without a look at
    /// a request that may be far away in memory.
    next_seq: u64,
    band: Link,
    /// Its tenant's weight.
    weight: u32,
    /// Its flow in its band (see [`band`]), while queued.
    flow_id: u32,
}

impl Node {
    pub(crate) fn new(
        seq: u64,
        rung: i64,
        tenant: Option<Tenant>,
        service: u64,
        weight: u32,
        queued_at: Option<Instant>,
        ladder: &Ladder,
    ) -> Node {
        let weight = weight.max(1);
        Node {
            seq,
            rung,
            tenant,
            weight,
            flow_id: 0,
            next_seq: 0,
            step: u128::from(service.max(1)).saturating_mul(TAG_SCALE) / u128::from(weight),
            queued_at,
            standing: ladder.standing(rung, queued_at),
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
#[derive(Debug, Clone)]
pub(crate) struct Ladder {
    /// Configured bands, ascending; empty: every priority is its own band.
    bands: Vec<i32>,
    aging: Option<Duration>,
    /// The origin of standings with aging.
    epoch: Instant,
}

impl Default for Ladder {
    fn default() -> Ladder {
        Ladder::new(Vec::new(), None)
    }
}

impl Ladder {
    pub(crate) fn new(bands: Vec<i32>, aging: Option<Duration>) -> Ladder {
        Ladder {
            bands,
            aging,
            epoch: Instant::now(),
        }
    }

    /// The standing of a band at `rung` whose oldest request was queued at
    /// `since` (now, for a newcomer): lower goes first. Without aging, minus
    /// the rung. With aging, the time queued in nanoseconds since the epoch
    /// minus `rung` intervals: a band rises one rung per interval waited, so
    /// the order of standings is the order of risen rungs, and it never
    /// changes with time.
    fn standing(&self, rung: i64, since: Option<Instant>) -> i128 {
        let Some(interval) = self.aging else {
            return -i128::from(rung);
        };
        let since = since.map_or(0, |since| {
            if since >= self.epoch {
                (since - self.epoch).as_nanos() as i128
            } else {
                -((self.epoch - since).as_nanos() as i128)
            }
        });
        let interval = interval.as_nanos().max(1) as i128;
        since.saturating_sub(i128::from(rung).saturating_mul(interval))
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

/// The queue of one bucket.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    bands: BTreeMap<i64, Band>,
    /// Each band's oldest request as (standing, arrival, rung): the first
    /// is the leading band.
    standings: BTreeSet<(i128, u64, i64)>,
    /// Each band's oldest request as (arrival, slot): the first is the
    /// request queued longest.
    oldest: BTreeSet<(u64, Slot)>,
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
    /// Its band's standing (see [`Ladder::standing`]).
    standing: i128,
}

impl Head {
    /// Whether this head goes before `other` (of another queue under the
    /// same ladder): the band risen higher first, then the older.
    pub(crate) fn before(&self, other: &Head) -> bool {
        (self.standing, self.seq) < (other.standing, other.seq)
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

    /// The request queued longest: the oldest arrival over every band.
    pub(crate) fn oldest(&self, _nodes: &impl Nodes) -> Option<Slot> {
        self.oldest.first().map(|&(_, slot)| slot)
    }

    /// Flows kept over every band (each has requests queued).
    #[cfg(test)]
    pub(crate) fn flow_count(&self) -> usize {
        self.bands.values().map(Band::flow_count).sum()
    }

    /// Queued requests in bands at or above `rung`: those a request joining
    /// at `rung` waits behind, whatever their tenants (aging aside).
    pub(crate) fn at_or_above(&self, rung: i64) -> usize {
        self.bands.range(rung..).map(|(_, band)| band.len).sum()
    }

    /// Records `slot` as the oldest request of its band.
    fn mark_oldest(&mut self, nodes: &impl Nodes, slot: Slot) {
        let node = nodes.node(slot);
        self.standings.insert((node.standing, node.seq, node.rung));
        self.oldest.insert((node.seq, slot));
    }

    /// Forgets `slot` as the oldest request of its band.
    fn unmark_oldest(&mut self, nodes: &impl Nodes, slot: Slot) {
        let node = nodes.node(slot);
        self.standings.remove(&(node.standing, node.seq, node.rung));
        self.oldest.remove(&(node.seq, slot));
    }

    /// Appends the request at `slot` (its node filled in but unlinked).
    pub(crate) fn push(&mut self, nodes: &mut impl Nodes, slot: Slot) {
        let rung = nodes.node(slot).rung;
        let band = self.bands.entry(rung).or_default();
        band.arrivals.push_back(nodes, slot, |node| &mut node.band);
        band.len += 1;
        band.join(nodes, slot);
        if band.len == 1 {
            self.mark_oldest(nodes, slot);
        }
        self.len += 1;
    }

    /// The first request in service order at `now`, passing over parked
    /// flows (and bands of parked flows only). O(log bands) unless bands
    /// of parked flows lead.
    pub(crate) fn head(
        &mut self,
        nodes: &impl Nodes,
        ladder: &Ladder,
        now: Option<Instant>,
    ) -> Option<Head> {
        for &(standing, _, key) in &self.standings {
            let band = self.bands.get_mut(&key).expect("a standing names a band");
            let Some((slot, seq)) = band.first() else {
                // Every flow of the band is parked.
                continue;
            };
            let oldest = band
                .arrivals
                .head()
                .expect("a band in the map is not empty");
            let rung = ladder.aged(key, nodes.node(oldest).queued_at, now);
            return Some(Head {
                slot,
                rung,
                seq,
                standing,
            });
        }
        None
    }

    /// Parks the flow of the queued request at `slot`: the queue passes
    /// over it, and over its band if every flow there is parked, until
    /// [`unpark`](Self::unpark) (its tenant is at its engine limit: it
    /// waits without holding up other tenants, and its requests keep their
    /// order).
    pub(crate) fn park(&mut self, nodes: &impl Nodes, slot: Slot) {
        let node = nodes.node(slot);
        self.bands
            .get_mut(&node.rung)
            .expect("a queued request's band")
            .park(node.flow_id);
    }

    /// Unparks every flow of `tenant`.
    pub(crate) fn unpark(&mut self, tenant: Option<Tenant>) {
        for band in self.bands.values_mut() {
            band.unpark(tenant);
        }
    }

    /// Whether a request arriving now at `rung` for `tenant` would be first
    /// in service order: nothing queued goes before it. It joins its band
    /// (and rises with it); between bands the lower standing goes first, the
    /// band already queued on a tie; inside its band it goes first if its
    /// start tag is below every waiting flow's.
    pub(crate) fn would_lead(
        &mut self,
        ladder: &Ladder,
        now: Option<Instant>,
        rung: i64,
        tenant: Option<Tenant>,
    ) -> bool {
        // Bands of parked flows only are passed over, as by `head`.
        for &(standing, _, leading) in &self.standings {
            if leading == rung {
                return self
                    .bands
                    .get_mut(&rung)
                    .expect("a standing names a band")
                    .would_lead(tenant);
            }
            if self
                .bands
                .get_mut(&leading)
                .expect("a standing names a band")
                .all_parked()
            {
                continue;
            }
            // Its own band, if it has one, lost to the leading band already.
            return !self.bands.contains_key(&rung) && ladder.standing(rung, now) < standing;
        }
        true
    }

    /// Takes the request at `slot` out of the queue. `served`: it leaves
    /// because it was admitted, its flow is charged for it and the band's
    /// clock advances; otherwise (cancelled, expired, displaced) it leaves
    /// no trace in the fair shares.
    pub(crate) fn remove(&mut self, nodes: &mut impl Nodes, slot: Slot, served: bool) {
        let Node {
            rung,
            band: band_link,
            ..
        } = *nodes.node(slot);
        if band_link.prev().is_none() {
            self.unmark_oldest(nodes, slot);
            if let Some(next) = band_link.next() {
                // The next arrival becomes the band's oldest: its standing is
                // the band's now.
                self.mark_oldest(nodes, next);
            }
        }
        let band = self.bands.get_mut(&rung).expect("a queued request's band");
        band.arrivals
            .unlink(nodes, band_link, |node| &mut node.band);
        band.len -= 1;
        self.len -= 1;
        if band.len == 0 {
            self.bands.remove(&rung);
            if self.bands.is_empty() {
                // Emptied maps and sets keep their root nodes: give them back.
                *self = Queue::default();
            }
            return;
        }

        band.leave(nodes, slot, served);
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
            std::iter::successors(band.arrivals.tail(), move |&slot| {
                nodes.node(slot).band.prev()
            })
        })
    }

    /// Every queued request, emptying the queue.
    pub(crate) fn take_all(&mut self, nodes: &impl Nodes) -> Vec<Slot> {
        let mut slots = Vec::with_capacity(self.len);
        for band in self.bands.values() {
            let mut cursor = band.arrivals.head();
            while let Some(slot) = cursor {
                slots.push(slot);
                cursor = nodes.node(slot).band.next();
            }
        }
        *self = Queue::default();
        slots
    }
}
