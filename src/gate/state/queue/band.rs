//! One band of a queue: its arrival order, and its backlogged tenants'
//! flows served by start-time fair queueing (see the [queue's
//! docs](super)).
//!
//! Flows live in a slab and are named by their index there, a dense id
//! that each queued request keeps ([`Node`]); the flow map only takes a
//! newcomer's tenant to its flow. A flow keeps its head's start tag and
//! arrival, so the heap of heads tells a live entry from a stale one, and
//! is rebuilt, from the flow slab alone, without touching the requests.
//!
//! Memory: the flow map and the heap give back their room as flows go
//! (amortised O(1) per event). The flow slab keeps room for the most flows
//! the band held at once since it last emptied: at most that many queued
//! requests, at 64 bytes a flow, a fraction of what the state's entry slab
//! keeps for the same requests until the gate is idle.
//!
//! # Invariants
//!
//! * A flow exists exactly while it has requests queued; `ids` names every
//!   flow by its tenant, and every request queued in the band has its
//!   flow's id in `flow_id`.
//! * `heads` holds, for every flow, the entry `(head_start, head_seq, id)`
//!   of its current head; any other entry is stale (its id names no flow,
//!   or a flow whose head is another request: arrivals are never reused).
//! * Every request of a flow but its tail has the arrival of the next in
//!   `next_seq`; every request but the head has a `prev` in its flow.
//! * `backlogged_weight` is the sum of the weights of the flows that are
//!   not parked.
//! * A parked flow (its tenant at its engine limit, see
//!   [`Queue::park`](super::Queue::park)) has no live entry in `heads`: the
//!   band passes over it, and its requests keep their order in it.

use std::collections::HashMap;

use slab::Slab;

use super::flow_hash::FlowKey;
use super::heads::Heads;
use super::{Ends, Node, Nodes, Slot};
use crate::gate::types::Tenant;

/// One backlogged tenant's queued requests in one band.
#[derive(Debug)]
struct Flow {
    /// Start tag of the flow's head.
    head_start: u128,
    /// Arrival of the flow's head.
    head_seq: u64,
    fifo: Ends,
    weight: u32,
    /// Passed over until its tenant has room again.
    parked: bool,
}

#[derive(Debug, Default)]
pub(super) struct Band {
    pub(super) arrivals: Ends,
    pub(super) len: usize,
    /// Backlogged flows only, by id.
    flows: Slab<Flow>,
    ids: HashMap<Option<Tenant>, u32, FlowKey>,
    /// The sum of the weights of the backlogged flows.
    backlogged_weight: u64,
    heads: Heads,
    /// The band's virtual time (see the queue's docs).
    virtual_time: u128,
}

impl Band {
    /// Flows kept (each has requests queued).
    #[cfg(test)]
    pub(super) fn flow_count(&self) -> usize {
        self.flows.len()
    }

    /// The flow first in fair order, dropping stale heap entries.
    fn first_flow(&mut self) -> Option<&Flow> {
        while let Some(&(start, seq, id)) = self.heads.first() {
            let live = self.flows.get(id as usize).is_some_and(|flow| {
                flow.head_seq == seq && flow.head_start == start && !flow.parked
            });
            if live {
                return self.flows.get(id as usize);
            }
            self.heads.pop();
        }
        None
    }

    /// The flow head first in fair order, and its arrival.
    pub(super) fn first(&mut self) -> Option<(Slot, u64)> {
        let flow = self.first_flow()?;
        Some((flow.fifo.head()?, flow.head_seq))
    }

    /// Whether a request of `tenant` arriving now would go first in the
    /// band: its flow has nothing queued, and the start tag it would get
    /// (the band's clock) is below every waiting flow's.
    pub(super) fn would_lead(&mut self, tenant: Option<Tenant>) -> bool {
        if self.ids.contains_key(&tenant) {
            return false;
        }
        let clock = self.virtual_time;
        self.first_flow()
            .is_none_or(|first| clock < first.head_start)
    }

    /// Links the request at `slot` in at the back of its tenant's flow,
    /// which starts at the band's clock if it had nothing queued.
    pub(super) fn join(&mut self, nodes: &mut impl Nodes, slot: Slot) {
        let Node {
            tenant,
            weight,
            seq,
            ..
        } = *nodes.node(slot);
        let vacant = self.flows.vacant_key() as u32;
        let id = *self.ids.entry(tenant).or_insert(vacant);
        if id == vacant {
            self.flows.insert(Flow {
                head_start: self.virtual_time,
                head_seq: seq,
                fifo: Ends::default(),
                weight,
                parked: false,
            });
            self.backlogged_weight += u64::from(weight);
            self.heads.push((self.virtual_time, seq, id));
        }
        nodes.node_mut(slot).flow_id = id;
        let fifo = &mut self.flows[id as usize].fifo;
        if let Some(tail) = fifo.tail() {
            nodes.node_mut(tail).next_seq = seq;
        }
        fifo.push_back(nodes, slot, |node| &mut node.flow);
    }

    /// Unlinks the request at `slot` from its flow. `served`: the flow is
    /// charged for it and the band's clock advances (see the queue's docs).
    pub(super) fn leave(&mut self, nodes: &mut impl Nodes, slot: Slot, served: bool) {
        let Node {
            tenant,
            step,
            flow: flow_link,
            flow_id: id,
            next_seq,
            ..
        } = *nodes.node(slot);
        let flow = &mut self.flows[id as usize];
        if flow.fifo.head() != Some(slot) {
            let prev = flow_link.prev().expect("a request behind its flow's head");
            nodes.node_mut(prev).next_seq = next_seq;
            flow.fifo.unlink(nodes, flow_link, |node| &mut node.flow);
            return;
        }
        flow.fifo.pop_front(flow_link);
        if served {
            // The clock advances by the service over the backlogged
            // weight (this flow's included), and never lags the tag
            // served.
            let service = step.saturating_mul(u128::from(flow.weight));
            let advance = service / u128::from(self.backlogged_weight.max(1));
            self.virtual_time = self
                .virtual_time
                .saturating_add(advance)
                .max(flow.head_start);
            // A flow that stays backlogged keeps its own tags: lifting
            // them to the clock would forget a lag of up to one step.
            flow.head_start = flow.head_start.saturating_add(step);
        }
        match flow.fifo.head() {
            Some(_) => {
                flow.head_seq = next_seq;
                if flow.parked {
                    // A parked flow was parked for its head's demand: a new
                    // head may fit where the old did not, so the flow is
                    // looked at again (and parked again if it does not).
                    flow.parked = false;
                    flow.head_start = flow.head_start.max(self.virtual_time);
                    self.backlogged_weight += u64::from(flow.weight);
                }
                self.heads.push((flow.head_start, flow.head_seq, id));
            }
            None => {
                if !flow.parked {
                    self.backlogged_weight -= u64::from(flow.weight);
                }
                self.flows.remove(id as usize);
                self.ids.remove(&tenant);
            }
        }
        self.compact();
    }

    /// Parks the flow `id`: the band passes over it (its heap entry turns
    /// stale) and its weight leaves the backlogged weight, as if it had
    /// emptied, until [`unpark`](Self::unpark).
    pub(super) fn park(&mut self, id: u32) {
        let flow = &mut self.flows[id as usize];
        if !flow.parked {
            flow.parked = true;
            self.backlogged_weight -= u64::from(flow.weight);
        }
        self.compact();
    }

    /// Unparks the flow of `tenant`, if it has a parked one here. It comes
    /// back as a flow that became backlogged: its head starts no earlier
    /// than the band's clock, so time parked earns it no credit over the
    /// flows served meanwhile.
    pub(super) fn unpark(&mut self, tenant: Option<Tenant>) {
        let Some(&id) = self.ids.get(&tenant) else {
            return;
        };
        let flow = &mut self.flows[id as usize];
        if !flow.parked {
            return;
        }
        flow.parked = false;
        flow.head_start = flow.head_start.max(self.virtual_time);
        self.backlogged_weight += u64::from(flow.weight);
        self.heads.push((flow.head_start, flow.head_seq, id));
    }

    /// Whether every flow is parked (or there is none).
    pub(super) fn all_parked(&mut self) -> bool {
        self.first_flow().is_none()
    }

    /// Rebuilds the heap when stale entries outnumber the live ones, and
    /// gives back the flow map's room once it is more than four times what
    /// the flows left need: amortised O(1) per event.
    ///
    /// The heap keeps its buffer unless it is more than twice the room a
    /// rebuilt heap grows to: a steady stream of arrivals and
    /// cancellations, whose stale entries bring a rebuild every few events,
    /// allocates nothing.
    fn compact(&mut self) {
        const SLACK: usize = 16;
        let live = self.flows.len();
        if self.heads.len() > 2 * live + SLACK {
            let heads = self.flows.iter().filter(|(_, flow)| !flow.parked);
            self.heads.rebuild(
                heads.map(|(id, flow)| (flow.head_start, flow.head_seq, id as u32)),
                2 * live + SLACK,
            );
        }
        if self.ids.capacity() > 4 * live + SLACK {
            self.ids.shrink_to(2 * live + SLACK);
        }
    }
}
