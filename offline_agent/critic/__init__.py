"""The learned critic: a value model V(state, action) fitted on the stored search trees."""
