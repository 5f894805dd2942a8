//! An explicit-state model checker: breadth-first over every interleaving,
//! every state kept as a 128-bit fingerprint (the state itself only while it
//! waits in the frontier), each reached state's parent and action kept so a
//! violation is printed as the shortest path of actions that leads to it.
//!
//! Safety: state invariants at every state, step invariants at every
//! transition. Liveness: after the search, every state the property applies
//! to must reach a goal state along fair transitions (a backward search from
//! the goals over the fair edges found).

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// A transition system to check.
pub(crate) trait Model {
    /// A state of the world (hashed into its fingerprint).
    type State: Clone + Hash + Debug;
    /// A step some actor may take.
    type Action: Clone + Debug;
    /// What a step did that its step invariants judge.
    type Obs: Debug;

    /// The initial state.
    fn init(&self) -> Self::State;
    /// The actions to try in `state` (some may turn out disabled).
    fn actions(&self, state: &Self::State, out: &mut Vec<Self::Action>);
    /// The state after `action`, with what it did; `None` when disabled.
    fn next(&self, state: &Self::State, action: &Self::Action) -> Option<(Self::State, Vec<Self::Obs>)>;
    /// The invariants of a state.
    fn check_state(&self, state: &Self::State) -> Result<(), String>;
    /// The invariants of one transition.
    fn check_step(
        &self,
        before: &Self::State,
        action: &Self::Action,
        obs: &[Self::Obs],
        after: &Self::State,
    ) -> Result<(), String>;
    /// Whether `action` is one a fair scheduler takes (no crash, no fault,
    /// no operator's decision): the liveness paths use only these.
    fn fair(&self, action: &Self::Action) -> bool;
    /// A state the liveness property wants to reach.
    fn goal(&self, state: &Self::State) -> bool;
    /// Whether the liveness property is asked of `state`.
    fn live_from(&self, state: &Self::State) -> bool;
    /// One line describing a state in a printed trace.
    fn describe(&self, state: &Self::State) -> String;
}

/// What a search found.
#[derive(Debug)]
pub(crate) struct Report {
    /// Distinct states reached.
    pub(crate) states: usize,
    /// Transitions taken (to new or known states).
    pub(crate) transitions: usize,
    /// The longest path from the initial state to a state's first visit
    /// (breadth-first: the longest shortest path).
    pub(crate) depth: usize,
    /// Wall time of the search.
    pub(crate) elapsed: Duration,
}

/// A violated property, with the shortest path that shows it.
#[derive(Debug)]
pub(crate) struct Violation {
    /// Which property, and why.
    pub(crate) property: String,
    /// The actions from the initial state, each with the state it led to.
    pub(crate) trace: Vec<String>,
    /// The number of actions in the trace.
    pub(crate) len: usize,
    /// What the search had covered when it stopped.
    pub(crate) report: Report,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "violated: {}", self.property)?;
        writeln!(f, "counterexample, {} actions:", self.len)?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

fn fingerprint<S: Hash>(state: &S) -> u128 {
    let mut a = DefaultHasher::new();
    0xa5u8.hash(&mut a);
    state.hash(&mut a);
    let mut b = DefaultHasher::new();
    0x5au8.hash(&mut b);
    state.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

const ROOT: u32 = u32::MAX;

struct Search<M: Model> {
    index: HashMap<u128, u32>,
    /// For each state: its parent and the action that reached it first.
    parent: Vec<(u32, Option<M::Action>)>,
    depth: Vec<u16>,
    goal: Vec<bool>,
    live_from: Vec<bool>,
    fair_edges: Vec<(u32, u32)>,
    transitions: usize,
}

/// In which order the states are explored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Breadth-first: every counterexample is a shortest one; the frontier
    /// holds a whole level of states.
    Breadth,
    /// Depth-first: the frontier holds one path's branches, so a large world
    /// fits in memory; a counterexample is a path, not the shortest.
    Depth,
}

/// Explores every state of `model` reachable from its initial state (at
/// most `limit`), breadth-first, checking its invariants, then its liveness property.
pub(crate) fn check<M: Model>(model: &M, limit: usize) -> Result<Report, Box<Violation>> {
    check_in(model, limit, Order::Breadth)
}

/// [`check`] in the given order.
pub(crate) fn check_in<M: Model>(model: &M, limit: usize, order: Order) -> Result<Report, Box<Violation>> {
    let started = Instant::now();
    let mut search = Search::<M> {
        index: HashMap::new(),
        parent: Vec::new(),
        depth: Vec::new(),
        goal: Vec::new(),
        live_from: Vec::new(),
        fair_edges: Vec::new(),
        transitions: 0,
    };
    let init = model.init();
    let mut frontier = VecDeque::new();
    search.admit(model, &init, ROOT, None, 0);
    if let Err(why) = model.check_state(&init) {
        return Err(search.violation(model, 0, why, started));
    }
    frontier.push_back((0u32, init));
    let mut actions = Vec::new();
    let progress = std::env::var_os("TASKFENCE_CHECK_PROGRESS").is_some();
    let mut next_report = 0;
    while let Some((at, state)) = match order {
        Order::Breadth => frontier.pop_front(),
        Order::Depth => frontier.pop_back(),
    } {
        if progress && search.parent.len() >= next_report {
            next_report += 500_000;
            eprintln!(
                "{} states, {} waiting, depth {}, {:.1?}",
                search.parent.len(),
                frontier.len(),
                search.depth[at as usize],
                started.elapsed()
            );
        }
        actions.clear();
        model.actions(&state, &mut actions);
        for action in &actions {
            let Some((after, obs)) = model.next(&state, action) else {
                continue;
            };
            search.transitions += 1;
            let fp = fingerprint(&after);
            let known = search.index.get(&fp).copied();
            let to = match known {
                Some(to) => {
                    if let Err(why) = model.check_step(&state, action, &obs, &after) {
                        // A known state by a new edge: the step itself is
                        // judged (shown as the path to its source, then this action).
                        let mut v = search.violation(model, at, why, started);
                        v.trace
                            .push(format!("{action:?}  ->  {}", model.describe(&after)));
                        v.len += 1;
                        return Err(v);
                    }
                    to
                }
                None => {
                    let to = search.admit(model, &after, at, Some(action.clone()), fp);
                    if let Err(why) = model.check_step(&state, action, &obs, &after) {
                        return Err(search.violation(model, to, why, started));
                    }
                    if let Err(why) = model.check_state(&after) {
                        return Err(search.violation(model, to, why, started));
                    }
                    if to as usize >= limit {
                        panic!("more than {limit} states: the configuration is too large");
                    }
                    frontier.push_back((to, after));
                    to
                }
            };
            if model.fair(action) {
                search.fair_edges.push((at, to));
            }
        }
    }
    search.liveness(model, started)
}

impl<M: Model> Search<M> {
    fn admit(
        &mut self,
        model: &M,
        state: &M::State,
        parent: u32,
        action: Option<M::Action>,
        fp: u128,
    ) -> u32 {
        let fp = if parent == ROOT { fingerprint(state) } else { fp };
        let id = self.parent.len() as u32;
        match self.index.entry(fp) {
            Entry::Occupied(_) => unreachable!("admitted twice"),
            Entry::Vacant(v) => v.insert(id),
        };
        let depth = if parent == ROOT {
            0
        } else {
            self.depth[parent as usize] + 1
        };
        self.parent.push((parent, action));
        self.depth.push(depth);
        self.goal.push(model.goal(state));
        self.live_from.push(model.live_from(state));
        id
    }

    fn report(&self, started: Instant) -> Report {
        Report {
            states: self.parent.len(),
            transitions: self.transitions,
            depth: self.depth.iter().copied().max().unwrap_or(0) as usize,
            elapsed: started.elapsed(),
        }
    }

    /// The path to state `to`, replayed from the initial state so each
    /// step shows the state it led to.
    fn violation(&self, model: &M, to: u32, property: String, started: Instant) -> Box<Violation> {
        let mut path = Vec::new();
        let mut at = to;
        while at != ROOT {
            let (parent, action) = &self.parent[at as usize];
            if let Some(action) = action {
                path.push(action.clone());
            }
            at = *parent;
        }
        path.reverse();
        let mut state = model.init();
        let mut trace = vec![format!("init  ->  {}", model.describe(&state))];
        for action in &path {
            state = model.next(&state, action).expect("a recorded step replays").0;
            trace.push(format!("{action:?}  ->  {}", model.describe(&state)));
        }
        Box::new(Violation {
            property,
            len: path.len(),
            trace,
            report: self.report(started),
        })
    }

    /// Every state the liveness property applies to reaches a goal along
    /// fair edges: a backward search from the goals.
    fn liveness(self, model: &M, started: Instant) -> Result<Report, Box<Violation>> {
        let n = self.parent.len();
        let mut start = vec![0u32; n + 1];
        for &(_, to) in &self.fair_edges {
            start[to as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut from = vec![0u32; self.fair_edges.len()];
        for &(f, to) in &self.fair_edges {
            from[fill[to as usize] as usize] = f;
            fill[to as usize] += 1;
        }
        let mut reaches = self.goal.clone();
        let mut queue: VecDeque<u32> = (0..n as u32).filter(|&i| reaches[i as usize]).collect();
        while let Some(to) = queue.pop_front() {
            for &f in &from[start[to as usize] as usize..start[to as usize + 1] as usize] {
                if !reaches[f as usize] {
                    reaches[f as usize] = true;
                    queue.push_back(f);
                }
            }
        }
        // States are numbered in breadth-first order: the first one found
        // has the shortest path.
        if let Some(stuck) = (0..n).find(|&i| self.live_from[i] && !reaches[i]) {
            return Err(self.violation(
                model,
                stuck as u32,
                "liveness: from the last state no fair schedule (no crash, fault or operator) finishes every task"
                    .into(),
                started,
            ));
        }
        Ok(self.report(started))
    }
}
