//! The stores an [`Intercepted`] can wrap: any store of a known type and
//! the `dyn TaskStore` and `dyn Inspect` trait objects.

use crate::inspect::Inspect;
use crate::store::TaskStore;

#[cfg(doc)]
use super::Intercepted;

/// A store [`Intercepted`] can wrap: any store of a known type, and the
/// `dyn TaskStore` and `dyn Inspect` trait objects.
///
/// ```
/// fn wraps<S: taskfence::intercept::Inner + ?Sized>() {}
/// wraps::<taskfence::MemoryStore>();
/// wraps::<dyn taskfence::TaskStore>();
/// ```
pub trait Inner: Send + Sync {
    /// This store as a trait object.
    fn store(&self) -> &dyn TaskStore;
}

impl<T: TaskStore> Inner for T {
    fn store(&self) -> &dyn TaskStore {
        self
    }
}

impl Inner for dyn TaskStore {
    fn store(&self) -> &dyn TaskStore {
        self
    }
}

impl Inner for dyn Inspect {
    fn store(&self) -> &dyn TaskStore {
        self
    }
}

/// A wrapped store that also answers [`Inspect`].
///
/// ```
/// fn inspects<S: taskfence::intercept::InnerInspect + ?Sized>() {}
/// inspects::<taskfence::MemoryStore>();
/// inspects::<dyn taskfence::inspect::Inspect>();
/// ```
pub trait InnerInspect: Inner {
    /// This store as an [`Inspect`] trait object.
    fn inspector(&self) -> &dyn Inspect;
}

impl<T: Inspect> InnerInspect for T {
    fn inspector(&self) -> &dyn Inspect {
        self
    }
}

impl InnerInspect for dyn Inspect {
    fn inspector(&self) -> &dyn Inspect {
        self
    }
}
